"""The no-change check-in's answer, kept per gateway process so it is not recomputed per call.

What a device should run depends on its organisation's releases, groups and pins, and on the
device row itself (attributes, labels, pin, running version).  The first are covered by a
fleet generation: a Redis counter per organisation that gateway.hints bumps before every
fleet-changed hint (any Release saved or deleted, any FleetChanged a service publishes), so
every gateway process sees it.  The device's own fields are part of the cache key, read from
the row the check-in loads anyway.  An entry also ends when its assignment nears half its
lifetime (releases.assignments reissues it then) and after MAX_AGE_SECONDS whatever happens.
A deleted assignment row (through the ORM, in a process that loaded the gateway) bumps the
generation too, so its successor is issued with a higher counter; a database restored
underneath running gateways is only seen after MAX_AGE_SECONDS (restart them), and meanwhile
devices get the assignment they hold.

Without Redis there is no shared generation, so nothing is cached and every check-in computes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass

from django.db import transaction
from django.db.models.signals import post_delete
from fleet.models import Device
from releases.models import DeviceAssignment

log = logging.getLogger(__name__)
GENERATION_KEY = "ferry:fleet-generation:{}"
MAX_AGE_SECONDS = 600.0
MAX_ENTRIES = 200_000


def _redis():
    url = os.environ.get("REDIS_URL", "")
    if not url:
        return None
    from gateway.hints import _redis_client

    return _redis_client(url)


def bump_generation(organisation_id: int) -> None:
    """Make every gateway's cached answers for this organisation stale (before hinting its devices)."""
    client = _redis()
    if client is None:
        return
    try:
        client.incr(GENERATION_KEY.format(organisation_id))
    except Exception as exc:  # redis raises several types; entries still end at MAX_AGE_SECONDS
        log.warning("could not bump the fleet generation of organisation %s: %s", organisation_id, exc)


def _assignment_deleted(sender, instance: DeviceAssignment, **kwargs) -> None:
    organisation_id = (
        Device.objects.filter(pk=instance.device_id).values_list("organisation_id", flat=True).first()
    )
    if organisation_id is not None:
        transaction.on_commit(lambda: bump_generation(organisation_id))


post_delete.connect(
    _assignment_deleted,
    sender=DeviceAssignment,
    dispatch_uid="gateway-desired-cache-assignment-deleted",
    weak=False,
)


def fleet_generation(organisation_id: int) -> int | None:
    """The organisation's generation, or None when it cannot be read (then nothing is cached)."""
    client = _redis()
    if client is None:
        return None
    try:
        return int(client.get(GENERATION_KEY.format(organisation_id)) or 0)
    except Exception as exc:
        log.warning("could not read the fleet generation of organisation %s: %s", organisation_id, exc)
        return None


def _device_key(device: Device, generation: int) -> tuple:
    return (
        generation,
        device.running_version_id,
        device.pinned_version_id,
        json.dumps(device.attributes or {}, sort_keys=True),
        json.dumps(device.labels or {}, sort_keys=True),
    )


@dataclass(frozen=True)
class _Entry:
    key: tuple
    answer: bytes | None  # a serialized PackageOffer; None: nothing decided for the device
    valid_until: float


class DesiredCache:
    """device id -> the last answer computed for it and the facts it was computed from."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def get(self, device: Device, generation: int | None) -> tuple[bool, bytes | None]:
        """(hit, answer): hit is False when the answer must be computed."""
        if generation is None:
            return False, None
        entry = self._entries.get(str(device.pk))
        if entry is None or entry.key != _device_key(device, generation) or time.time() >= entry.valid_until:
            return False, None
        return True, entry.answer

    def put(self, device: Device, generation: int | None, answer: bytes | None, valid_until: float) -> None:
        if generation is None:
            return
        entry = _Entry(
            _device_key(device, generation), answer, min(valid_until, time.time() + MAX_AGE_SECONDS)
        )
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # simplest bound: a full cache starts over
            self._entries[str(device.pk)] = entry
