"""Push-then-pull: tell connected agents to check in now when their organisation's releases change.

A hint carries no instruction (the next CheckIn does), so losing one only delays a
device until its next regular check-in.  Two ways to hear about a change:

- Redis pub/sub when REDIS_URL is set: whichever process saves a release publishes the
  organisation's id on one channel, and every gateway replica hears it;
- otherwise (the embedded profile) a short poll of the releases table: a change of the
  organisation's release count or newest ``updated_at`` is a change.

A device holds at most one stream: a new WatchHints of the same device closes its old one,
so one device cannot take the hub's slots from the rest of the fleet.  The hub's thread also
looks up, every second, whether a watching device was revoked, and closes its stream.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max
from ferry_cloud.events import FleetChanged

log = logging.getLogger(__name__)
CHANNEL = "ferry:fleet-changed"
REVOCATION_CHECK_SECONDS = 1.0


@dataclass(frozen=True)
class StreamClosed:
    """Put on a stream's queue instead of a reason: the stream must end, and why."""

    revoked: bool
    message: str


REPLACED = StreamClosed(False, "a newer WatchHints stream of this device replaced this one")
REVOKED = StreamClosed(True, "This device has been revoked; its streams are closed.")


def hint_fleet_changed(event: FleetChanged) -> None:
    """The gateway's subscriber to the domain's FleetChanged (GatewayConfig.ready registers it).

    ferry_cloud.events runs it after the change commits, so an agent that checks in on the
    hint sees the change.  Without Redis the gateway's poll finds it on its own.
    """
    _publish(event.organisation_id)


def fleet_changed(*, organisation_id: int) -> None:
    """The same hint for any saved or deleted Release row, the admin's and a shell's included
    (GatewayConfig.ready's post_save bridge), published after the surrounding transaction commits."""
    if _redis_url():
        transaction.on_commit(lambda: _publish(organisation_id))


def _publish(organisation_id: int) -> None:
    url = _redis_url()
    if not url:
        return
    from gateway.desired_cache import bump_generation

    bump_generation(organisation_id)  # before the hint: a device it wakes must not get a cached answer
    try:
        _redis_client(url).publish(CHANNEL, str(organisation_id))
    except Exception as exc:  # redis raises several types; a lost hint only delays devices
        log.warning("could not publish a fleet-changed hint: %s", exc)


def _redis_url() -> str:
    return os.environ.get("REDIS_URL", "")


_clients: dict[str, object] = {}


def _redis_client(url: str):
    import redis

    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return _clients[url]


class HintHub:
    """Subscribers (one queue per open WatchHints stream) per organisation, fed by one thread."""

    def __init__(self, *, redis_url: str = "", poll_seconds: float = 1.0, max_watchers: int = 64) -> None:
        self.redis_url = redis_url
        self.poll_seconds = poll_seconds
        self.max_watchers = max_watchers
        self._lock = threading.Lock()
        self._subscribers: dict[int, set[queue.Queue]] = defaultdict(set)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[int, tuple] = {}  # polling mode: organisation -> (release count, newest change)
        self._by_device: dict[str, queue.Queue] = {}  # the one open stream of each device
        self._revocations_checked = 0.0

    @classmethod
    def from_settings(cls) -> HintHub:
        return cls(redis_url=_redis_url(), max_watchers=getattr(settings, "FERRY_GATEWAY_MAX_WATCHERS", 64))

    @property
    def watchers(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._subscribers.values())

    def subscribe(self, organisation_id: int, device_id: str = "") -> queue.Queue | None:
        """A queue that receives a reason per change; None when the hub is full (the agent polls).

        Given the device's id, its previous stream (if any) receives REPLACED and ends."""
        if not self.redis_url and organisation_id not in self._seen:
            # the baseline is taken now, so a change right after the stream opens is not missed
            self._seen[organisation_id] = _release_states([organisation_id]).get(organisation_id, (0, None))
        with self._lock:
            previous = self._by_device.pop(device_id, None) if device_id else None
            if previous is not None:
                _close(previous, REPLACED)
                for subscribers in self._subscribers.values():
                    subscribers.discard(previous)  # its slot is free for the new stream now
            if sum(len(s) for s in self._subscribers.values()) >= self.max_watchers:
                return None
            q: queue.Queue = queue.Queue(maxsize=8)
            self._subscribers[organisation_id].add(q)
            if device_id:
                self._by_device[device_id] = q
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                target = self._listen_redis if self.redis_url else self._poll_database
                self._thread = threading.Thread(target=target, name="hint-hub", daemon=True)
                self._thread.start()
            return q

    def unsubscribe(self, organisation_id: int, q: queue.Queue) -> None:
        with self._lock:
            self._subscribers[organisation_id].discard(q)
            if not self._subscribers[organisation_id]:
                del self._subscribers[organisation_id]
            for device_id, held in list(self._by_device.items()):
                if held is q:
                    del self._by_device[device_id]

    def close_device(self, device_id: str, closing: StreamClosed = REVOKED) -> bool:
        """End the device's open stream, if it has one; returns whether it had."""
        with self._lock:
            q = self._by_device.pop(device_id, None)
            if q is None:
                return False
            for subscribers in self._subscribers.values():
                subscribers.discard(q)
        _close(q, closing)
        return True

    def close_revoked(self) -> int:
        """Close the streams of watching devices revoked since; at most once a second. How many closed."""
        now = time.monotonic()
        if now - self._revocations_checked < REVOCATION_CHECK_SECONDS:
            return 0
        self._revocations_checked = now
        with self._lock:
            watching = list(self._by_device)
        if not watching:
            return 0
        from fleet.models import Device

        try:
            revoked = Device.objects.filter(pk__in=watching, revoked_at__isnull=False).values_list(
                "pk", flat=True
            )
            closed = sum(self.close_device(str(pk)) for pk in revoked)
        except Exception as exc:  # database briefly unavailable: check again next second
            log.warning("hint hub could not check revocations: %s", exc)
            return 0
        finally:
            connection.close()
        return closed

    def notify(self, organisation_id: int, reason: str) -> int:
        """Wake every stream of the organisation; returns how many were woken."""
        with self._lock:
            targets = list(self._subscribers.get(organisation_id, ()))
        for q in targets:
            # a full queue means that stream has hints pending already: one check-in covers them all
            with contextlib.suppress(queue.Full):
                q.put_nowait(reason)
        return len(targets)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _organisations(self) -> list[int]:
        with self._lock:
            return list(self._subscribers)

    def _listen_redis(self) -> None:
        import redis

        while not self._stop.is_set():
            try:
                pubsub = redis.Redis.from_url(self.redis_url, socket_connect_timeout=5).pubsub()
                pubsub.subscribe(CHANNEL)
                while not self._stop.is_set():
                    message = pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message and message["type"] == "message":
                        self.notify(int(message["data"]), "release changed")
                    self.close_revoked()
                pubsub.close()
            except Exception as exc:  # connection lost: agents still poll; resubscribe shortly
                log.warning("hint hub lost Redis (%s); resubscribing", exc)
                self._stop.wait(2.0)

    def _poll_database(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.close_revoked()
            organisations = self._organisations()
            if not organisations:
                continue
            try:
                current = _release_states(organisations)
            except Exception as exc:  # database briefly unavailable: try again next tick
                log.warning("hint hub could not read releases: %s", exc)
                continue
            finally:
                connection.close()  # a poll every second must not pin a connection per gateway
            for org in organisations:
                state = current.get(org, (0, None))
                if org in self._seen and self._seen[org] != state:
                    self.notify(org, "release changed")
                self._seen[org] = state


def _close(q: queue.Queue, closing: StreamClosed) -> None:
    """Make closing the next thing the stream reads, whatever hints were pending."""
    with contextlib.suppress(queue.Empty):
        while True:
            q.get_nowait()
    with contextlib.suppress(queue.Full):
        q.put_nowait(closing)


def _release_states(organisations: list[int]) -> dict[int, tuple]:
    """Per organisation: how many releases and when the newest change was (a cheap fingerprint)."""
    from releases.models import Release

    rows = (
        Release.objects.filter(organisation_id__in=organisations)
        .values("organisation_id")
        .annotate(n=Count("id"), newest=Max("updated_at"))
    )
    return {r["organisation_id"]: (r["n"], r["newest"]) for r in rows}
