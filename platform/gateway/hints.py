"""Push-then-pull: tell connected agents to check in now when their organisation's releases change.

A hint carries no instruction (the next CheckIn does), so losing one only delays a
device until its next regular check-in.  Two ways to hear about a change:

- Redis pub/sub when REDIS_URL is set: whichever process saves a release publishes the
  organisation's id on one channel, and every gateway process hears it on its one subscription;
- otherwise (the embedded profile) a short poll of the releases table: a change of the
  organisation's release count or newest ``updated_at`` is a change.

The hub holds no thread per stream: each open WatchHints stream is a mailbox (gateway.mailbox)
on the gateway's event loop, and one listener task (gateway.hint_listener) fans every change
out to the mailboxes of the organisation.  A device holds at most one stream: a new WatchHints
of the same device closes its old one, so one device cannot take the hub's slots from the rest
of the fleet.  The listener also looks up, every second, which devices were revoked, and
closes their streams.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import defaultdict

from django.db import transaction
from ferry_cloud.events import FleetChanged

from gateway.desired_cache import bump_generation
from gateway.hint_listener import Listener
from gateway.mailbox import REPLACED, REVOKED, AsyncMailbox, Mailbox, StreamClosed, SyncMailbox
from gateway.redis_channel import CHANNEL, redis_client, redis_url

__all__ = ["CHANNEL", "REPLACED", "REVOKED", "HintHub", "StreamClosed", "fleet_changed", "hint_fleet_changed"]

log = logging.getLogger(__name__)
# Streams one gateway process holds at most; past that, agents are told to poll.  An open stream
# costs a few kilobytes and no thread, so the cap is about memory, not threads.
DEFAULT_MAX_WATCHERS = 20_000


def hint_fleet_changed(event: FleetChanged) -> None:
    """The gateway's subscriber to the domain's FleetChanged (GatewayConfig.ready registers it).

    ferry_cloud.events runs it after the change commits, so an agent that checks in on the
    hint sees the change.  Without Redis the gateway's poll finds it on its own.
    """
    _publish(event.organisation_id)


def fleet_changed(*, organisation_id: int) -> None:
    """The same hint for any saved or deleted Release row, the admin's and a shell's included
    (GatewayConfig.ready's post_save bridge), published after the surrounding transaction commits."""
    if redis_url():
        transaction.on_commit(lambda: _publish(organisation_id))


def _publish(organisation_id: int) -> None:
    url = redis_url()
    if not url:
        return
    bump_generation(organisation_id)  # before the hint: a device it wakes must not get a cached answer
    try:
        redis_client(url).publish(CHANNEL, str(organisation_id))
    except Exception as exc:  # redis raises several types; a lost hint only delays devices
        log.warning("could not publish a fleet-changed hint: %s", exc)


class HintHub:
    """Mailboxes (one per open WatchHints stream) per organisation, fed by one listener task.

    The listener runs on the event loop ``start`` is given (the gateway server's), or, for a
    synchronous server's streams, on a loop thread of the hub's own."""

    def __init__(
        self, *, redis_url: str = "", poll_seconds: float = 1.0, max_watchers: int = DEFAULT_MAX_WATCHERS
    ) -> None:
        self.redis_url = redis_url
        self.poll_seconds = poll_seconds
        self.max_watchers = max_watchers
        self._lock = threading.Lock()  # notify may run on another thread than the streams' loop
        self._subscribers: dict[int, set[Mailbox]] = defaultdict(set)
        self._by_device: dict[str, Mailbox] = {}  # the one open stream of each device
        self._count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future | None = None
        self._own_loop: threading.Thread | None = None
        self.listener = Listener(self)

    @classmethod
    def from_settings(cls) -> HintHub:
        limit = int(os.environ.get("FERRY_GATEWAY_MAX_WATCHERS", "") or DEFAULT_MAX_WATCHERS)
        return cls(redis_url=redis_url(), max_watchers=limit)

    @property
    def watchers(self) -> int:
        return self._count

    def watching_devices(self) -> list[str]:
        with self._lock:
            return list(self._by_device)

    def organisations(self) -> list[int]:
        with self._lock:
            return list(self._subscribers)

    # --- the listener's life ----------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the listener on loop (thread-safe; a second start is a no-op)."""
        with self._lock:
            if self._task is not None:
                return
            self._loop = loop
            self._task = asyncio.run_coroutine_threadsafe(self.listener.run(), loop)

    def _ensure_started(self) -> None:
        """A synchronous server's first stream: the listener gets a loop thread of its own."""
        if self._task is not None:
            return
        loop = asyncio.new_event_loop()
        self._own_loop = threading.Thread(target=loop.run_forever, name="hint-hub", daemon=True)
        self._own_loop.start()
        self.start(loop)

    def stop(self) -> None:
        """End the listener (its Redis subscription and polls); safe to call more than once."""
        with self._lock:
            task, loop, self._task = self._task, self._loop, None
        if task is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
        if self._own_loop is not None and loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            self._own_loop.join(timeout=5)
            self._own_loop = None

    # --- streams ------------------------------------------------------------------------------

    def subscribe(self, organisation_id: int, device_id: str = "") -> SyncMailbox | None:
        """For a thread-per-stream server: a queue that receives a reason per change; None when
        the hub is full (the agent polls).  Given the device's id, its previous stream (if any)
        receives REPLACED and ends."""
        self.listener.baseline(organisation_id)
        self._ensure_started()
        return self._add(SyncMailbox(), organisation_id, device_id)

    async def watch(self, organisation_id: int, device_id: str) -> AsyncMailbox | None:
        """For a stream on the running event loop: its mailbox, or None when the hub is full."""
        if not self.redis_url:
            await asyncio.get_running_loop().run_in_executor(None, self.listener.baseline, organisation_id)
        return self._add(AsyncMailbox(asyncio.get_running_loop()), organisation_id, device_id)

    def _add(self, mailbox: Mailbox, organisation_id: int, device_id: str) -> Mailbox | None:
        with self._lock:
            previous = self._by_device.pop(device_id, None) if device_id else None
            if previous is not None:
                self._discard(previous)  # its slot is free for the new stream now
                previous.deliver(REPLACED)
            if self._count >= self.max_watchers:
                return None
            mailbox.organisation_id, mailbox.device_id = organisation_id, device_id
            self._subscribers[organisation_id].add(mailbox)
            self._count += 1
            if device_id:
                self._by_device[device_id] = mailbox
            return mailbox

    def unsubscribe(self, organisation_id: int, mailbox: Mailbox) -> None:
        with self._lock:
            self._discard(mailbox)

    def _discard(self, mailbox: Mailbox) -> None:
        """Under the lock: forget the mailbox wherever it is (idempotent)."""
        subscribers = self._subscribers.get(mailbox.organisation_id)
        if subscribers is not None and mailbox in subscribers:
            subscribers.discard(mailbox)
            self._count -= 1
            if not subscribers:
                del self._subscribers[mailbox.organisation_id]
        if mailbox.device_id and self._by_device.get(mailbox.device_id) is mailbox:
            del self._by_device[mailbox.device_id]

    def close_device(self, device_id: str, closing: StreamClosed = REVOKED) -> bool:
        """End the device's open stream, if it has one; returns whether it had."""
        with self._lock:
            mailbox = self._by_device.get(device_id)
            if mailbox is None:
                return False
            self._discard(mailbox)
        mailbox.deliver(closing)
        return True

    def notify(self, organisation_id: int, reason: str) -> int:
        """Wake every stream of the organisation; returns how many were woken."""
        with self._lock:
            targets = list(self._subscribers.get(organisation_id, ()))
        by_loop: dict[asyncio.AbstractEventLoop | None, list[Mailbox]] = defaultdict(list)
        for mailbox in targets:
            by_loop[mailbox.loop].append(mailbox)
        for loop, mailboxes in by_loop.items():
            _deliver_all(loop, mailboxes, reason)
        return len(targets)


def _deliver_all(loop: asyncio.AbstractEventLoop | None, mailboxes: list[Mailbox], reason: str) -> None:
    """One hand-over per event loop, not one per stream: 10,000 streams cost one wake-up."""

    at = time.monotonic()

    def deliver() -> None:
        for mailbox in mailboxes:
            mailbox.deliver(reason, at)

    if loop is None or _running_loop() is loop:
        deliver()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(deliver)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
