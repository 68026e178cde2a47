"""A release wave: messages published together make one wave, and each stream's hint is timed
from the hub hearing the change to grpc taking the message (ferry_gateway_hint_delivery_seconds)."""

from __future__ import annotations

import asyncio
import threading
import time

from gateway import metrics
from gateway.hint_listener import coalesced
from gateway.hints import HintHub
from gateway.mailbox import REVOKED, AsyncMailbox

from tests.platform.gateway.test_gateway_hints import _serve, _watch


class _PubSub:
    """redis.asyncio's PubSub.get_message, over messages that arrive at given loop times."""

    def __init__(self, arrivals: list[tuple[float, dict]]) -> None:
        self.arrivals = arrivals
        self.start = asyncio.get_running_loop().time()

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float):
        loop = asyncio.get_running_loop()
        if not self.arrivals:
            await asyncio.sleep(timeout)
            return None
        at, message = self.arrivals[0]
        wait = self.start + at - loop.time()
        if wait > timeout:
            await asyncio.sleep(timeout)
            return None
        await asyncio.sleep(max(wait, 0))
        self.arrivals.pop(0)
        return message


def _message(organisation_id: int) -> dict:
    return {"type": "message", "data": str(organisation_id).encode()}


def test_messages_published_together_make_one_wave_per_organisation():
    async def run() -> tuple[set[int], int]:
        # a release's two publishes, another organisation's, then one well after the window
        pubsub = _PubSub([(0.0, _message(7)), (0.005, _message(9)), (0.5, _message(11))])
        heard = await coalesced(pubsub, {7}, window=0.05)
        return heard, len(pubsub.arrivals)

    heard, left = asyncio.run(run())
    assert heard == {7, 9}
    assert left == 1, "a message after the window is the next wave's"


def test_a_mailbox_keeps_when_its_pending_hint_was_heard():
    async def run() -> tuple[float, float, float]:
        mailbox = AsyncMailbox(asyncio.get_running_loop())
        mailbox.deliver("release changed", 100.0)
        mailbox.deliver("release changed", 200.0)  # coalesced into the pending one: its time stays
        first = mailbox.since
        mailbox.deliver(REVOKED, 300.0)  # a closing replaces what was pending
        closing = mailbox.since
        await mailbox.next(asyncio.get_running_loop().time() + 1)
        mailbox.deliver("release changed")  # no time given: now
        return first, closing, mailbox.since

    first, closing, now = asyncio.run(run())
    assert (first, closing) == (100.0, 300.0)
    assert abs(now - time.monotonic()) < 5.0


def _delivered() -> tuple[float, float]:
    """The hint-delivery histogram's count and sum so far."""
    samples = {s.name: s.value for m in metrics.HINT_SECONDS.collect() for s in m.samples}
    return samples["ferry_gateway_hint_delivery_seconds_count"], samples[
        "ferry_gateway_hint_delivery_seconds_sum"
    ]


def test_a_hint_written_is_timed_from_the_hub_hearing_it(org, transactional_db):
    hub = HintHub(poll_seconds=60)  # no poll in the test's time: the hint is the notify below
    server, gateway = _serve(hub)
    try:
        hints, got, stream = _watch(gateway, org)
        for _ in range(100):
            if hub.watchers == 1:
                break
            threading.Event().wait(0.05)
        assert hub.watchers == 1
        count, total = _delivered()
        assert hub.notify(org.pk, "release changed") == 1
        assert got.wait(10), "no hint after the hub was notified"
        for _ in range(100):  # observed once grpc took the message, a moment after it left
            if _delivered()[0] == count + 1:
                break
            threading.Event().wait(0.05)
        after, after_total = _delivered()
        assert after == count + 1
        assert 0.0 < after_total - total < 10.0
        stream.cancel()
    finally:
        server.stop(grace=None)
        hub.stop()
