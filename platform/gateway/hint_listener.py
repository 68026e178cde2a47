"""The hint hub's one listener per gateway process, a task on the gateway's event loop.

With Redis: one pub/sub subscription (redis.asyncio) to the fleet-changed channel, whatever the
number of streams.  Without: a poll of the releases table every poll_seconds.  Either way, once
a second, the devices revoked lately are looked up and their streams closed.  Database work runs
in the loop's few worker threads (Django's ORM is synchronous), whose connections live as long
as CONN_MAX_AGE allows, like the gateway's other threads'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from typing import Protocol

from django.db import close_old_connections
from django.db.models import Count, Max
from django.utils import timezone

from gateway.redis_channel import CHANNEL

log = logging.getLogger(__name__)
REVOCATION_CHECK_SECONDS = 1.0
# Revocations looked up again each second: covers clocks of web and gateway a little apart and
# a revocation committed a moment after the time it records.
REVOCATION_MARGIN = timedelta(seconds=30)
RESUBSCRIBE_SECONDS = 2.0
# A release's transition publishes twice (its saved row, then its FleetChanged), a few
# milliseconds apart: messages heard within this window of the first make one wave, not one
# each (10,000 streams would write every hint twice).  Safe: the wave leaves after the last.
COALESCE_SECONDS = 0.05


class Hub(Protocol):
    """What the listener needs of gateway.hints.HintHub (which owns it)."""

    redis_url: str
    poll_seconds: float

    @property
    def watchers(self) -> int: ...

    def notify(self, organisation_id: int, reason: str) -> int: ...

    def organisations(self) -> list[int]: ...

    def close_device(self, device_id: str) -> bool: ...


class Listener:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._seen: dict[int, tuple] = {}  # polling mode: organisation -> (release count, newest change)
        self._revocations_checked = 0.0
        self._revoked_since: datetime = timezone.now() - REVOCATION_MARGIN

    async def run(self) -> None:
        if self.hub.redis_url:
            await self._listen_redis()
        else:
            await self._poll_database()

    def baseline(self, organisation_id: int) -> None:
        """Polling mode: the organisation's state as a stream opens, so a change right after the
        stream opens is not missed (blocking: a worker thread's)."""
        if self.hub.redis_url or organisation_id in self._seen:
            return
        try:
            self._seen[organisation_id] = _release_states([organisation_id]).get(organisation_id, (0, None))
        finally:
            close_old_connections()

    async def _listen_redis(self) -> None:
        import redis.asyncio as aioredis

        while True:
            client = aioredis.Redis.from_url(self.hub.redis_url, socket_connect_timeout=5)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    while True:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=REVOCATION_CHECK_SECONDS
                        )
                        if message and message["type"] == "message":
                            for organisation_id in await coalesced(pubsub, {int(message["data"])}):
                                self.hub.notify(organisation_id, "release changed")
                        await self.close_revoked()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost: agents still poll; resubscribe shortly
                log.warning("hint hub lost Redis (%s); resubscribing", exc)
                await asyncio.sleep(RESUBSCRIBE_SECONDS)
            finally:
                await client.aclose()

    async def _poll_database(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.hub.poll_seconds)
            await self.close_revoked()
            organisations = self.hub.organisations()
            if not organisations:
                continue
            try:
                current = await loop.run_in_executor(None, _states_then_close, organisations)
            except Exception as exc:  # database briefly unavailable: try again next tick
                log.warning("hint hub could not read releases: %s", exc)
                continue
            for org in organisations:
                state = current.get(org, (0, None))
                if org in self._seen and self._seen[org] != state:
                    self.hub.notify(org, "release changed")
                self._seen[org] = state

    async def close_revoked(self) -> int:
        """Close the streams of watching devices revoked lately; at most once a second. How many."""
        now = time.monotonic()
        if now - self._revocations_checked < REVOCATION_CHECK_SECONDS or not self.hub.watchers:
            return 0
        self._revocations_checked = now
        since, asked_at = self._revoked_since, timezone.now()
        try:
            revoked = await asyncio.get_running_loop().run_in_executor(None, _revoked_since, since)
        except Exception as exc:  # database briefly unavailable: check again next second
            log.warning("hint hub could not check revocations: %s", exc)
            return 0
        self._revoked_since = asked_at - REVOCATION_MARGIN
        return sum(self.hub.close_device(device_id) for device_id in revoked)


async def coalesced(pubsub, organisations: set[int], window: float = COALESCE_SECONDS) -> set[int]:
    """The organisations of the message just heard and of those published within ``window`` of it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window
    while (left := deadline - loop.time()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is None:
            break
        if message["type"] == "message":
            organisations.add(int(message["data"]))
    return organisations


def _revoked_since(since: datetime) -> list[str]:
    """Devices revoked at or after since (few: the query's cost does not grow with the streams)."""
    from fleet.models import Device

    try:
        return [str(pk) for pk in Device.objects.filter(revoked_at__gte=since).values_list("pk", flat=True)]
    finally:
        close_old_connections()


def _states_then_close(organisations: list[int]) -> dict[int, tuple]:
    try:
        return _release_states(organisations)
    finally:
        close_old_connections()


def _release_states(organisations: list[int]) -> dict[int, tuple]:
    """Per organisation: how many releases and when the newest change was (a cheap fingerprint)."""
    from releases.models import Release

    rows = (
        Release.objects.filter(organisation_id__in=organisations)
        .values("organisation_id")
        .annotate(n=Count("id"), newest=Max("updated_at"))
    )
    return {r["organisation_id"]: (r["n"], r["newest"]) for r in rows}
