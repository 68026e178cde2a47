"""Where the hint hub leaves news for one open WatchHints stream.

Only whether a hint is pending matters (one check-in covers any number of changes), so a
mailbox holds at most one reason, and a closing (the stream must end) replaces whatever was
pending.  AsyncMailbox is the gateway's: a slot and a future on the event loop, a few hundred
bytes per stream.  SyncMailbox is a queue for a thread-per-stream server (the servicer's own
WatchHints), kept so that servicer still works on a plain grpc.server.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamClosed:
    """Delivered instead of a reason: the stream must end, and why."""

    revoked: bool
    message: str


REPLACED = StreamClosed(False, "a newer WatchHints stream of this device replaced this one")
REVOKED = StreamClosed(True, "This device has been revoked; its streams are closed.")


class AsyncMailbox:
    """One stream's pending hint on an event loop; deliver() must run on that loop."""

    __slots__ = ("device_id", "loop", "organisation_id", "since", "_pending", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.organisation_id = 0
        self.device_id = ""
        self.since = 0.0  # when the pending reason was heard (time.monotonic, the loop's clock)
        self._pending: str | StreamClosed | None = None
        self._waiter: asyncio.Future | None = None

    def deliver(self, reason: str | StreamClosed, at: float = 0.0) -> None:
        """Leave reason (heard at ``at``, time.monotonic(); default now) and wake the stream."""
        if isinstance(reason, StreamClosed) or self._pending is None:
            self._pending = reason
            self.since = at or time.monotonic()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, deadline: float) -> str | StreamClosed | None:
        """The pending reason, waiting for one until deadline (the loop's time): None then."""
        while self._pending is None:
            if self.loop.time() >= deadline:
                return None
            self._waiter = self.loop.create_future()
            timer = self.loop.call_at(deadline, _wake, self._waiter)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
        reason, self._pending = self._pending, None
        return reason


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SyncMailbox(queue.Queue):
    """One stream's hints as a queue (get(timeout=...) raises queue.Empty); any thread may deliver."""

    loop = None  # delivered to from whichever thread notifies

    def __init__(self) -> None:
        super().__init__(maxsize=8)
        self.organisation_id = 0
        self.device_id = ""

    def deliver(self, reason: str | StreamClosed, at: float = 0.0) -> None:
        if isinstance(reason, StreamClosed):  # the next thing the stream reads, whatever was pending
            with contextlib.suppress(queue.Empty):
                while True:
                    self.get_nowait()
        # a full queue means hints are pending already: one check-in covers them all
        with contextlib.suppress(queue.Full):
            self.put_nowait(reason)

    __hash__ = object.__hash__


Mailbox = AsyncMailbox | SyncMailbox
