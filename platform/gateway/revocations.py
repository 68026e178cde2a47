"""Revoked devices, told to every gateway process that answers check-ins from memory.

fleet.services.device_revoke publishes DeviceRevoked; this module's subscriber (registered by
GatewayConfig.ready in every process) runs after the revocation commits and

- makes this process forget the device at once (the callbacks registered with ``on_revoked``);
- appends the device to a Redis stream every gateway reads every quarter second
  (gateway.checkin_fast's refresher), whose entries are ordered by the Redis server's clock.

A gateway that cannot read the stream stops answering from memory within
checkin_fast.STALE_SECONDS, so a revoked device is refused within a second everywhere; the
computed check-in reads the device row and refuses it at once.
"""

from __future__ import annotations

import logging
import threading
import weakref

from ferry_cloud.events import DeviceRevoked

from gateway.desired_cache import _redis

log = logging.getLogger(__name__)
STREAM = "ferry:revoked-devices"
STREAM_MAXLEN = 100_000
# A feed starts this far back: a check-in computed just before a revocation committed may be
# remembered just after the feed started.
START_BACK_MS = 60_000
_listeners: weakref.WeakSet = weakref.WeakSet()
_listeners_lock = threading.Lock()


class RevocationListener:
    """What on_revoked registers: something that can forget a device (held weakly)."""

    def forget(self, device_id: str) -> None:  # pragma: no cover - an interface
        raise NotImplementedError


def on_revoked(listener: RevocationListener) -> None:
    with _listeners_lock:
        _listeners.add(listener)


def forget_everywhere(device_id: str) -> None:
    """Every listener of this process forgets the device."""
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener.forget(device_id)


def device_revoked(event: DeviceRevoked) -> None:
    """The gateway's subscriber to DeviceRevoked (GatewayConfig.ready registers it)."""
    forget_everywhere(event.device_id)
    client = _redis()
    if client is None:
        return  # without Redis nothing is answered from memory
    try:
        client.xadd(STREAM, {"device": event.device_id}, maxlen=STREAM_MAXLEN, approximate=True)
    except Exception as exc:  # redis raises several types; gateways then stop answering from memory
        log.warning("could not announce the revocation of device %s: %s", event.device_id, exc)


class RevocationFeed:
    """Reads the stream from where it stopped; ``poll`` returns the device ids revoked since."""

    def __init__(self) -> None:
        self._last_id: str | None = None

    def poll(self) -> list[str] | None:
        """The devices revoked since the last poll; None when Redis cannot be read."""
        client = _redis()
        if client is None:
            return None
        try:
            if self._last_id is None:
                seconds, micros = client.time()
                self._last_id = f"{max(0, seconds * 1000 + micros // 1000 - START_BACK_MS)}-0"
            revoked: list[str] = []
            while True:
                answer = client.xread({STREAM: self._last_id}, count=1000)
                entries = answer[0][1] if answer else []
                for entry_id, fields in entries:
                    self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    device = fields.get(b"device") or fields.get("device")
                    if device:
                        revoked.append(device.decode() if isinstance(device, bytes) else device)
                if len(entries) < 1000:
                    return revoked
        except Exception as exc:
            log.warning("could not read the revoked devices: %s", exc)
            return None
