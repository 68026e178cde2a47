"""The fleet generation: when a gateway's remembered check-in answers stop being true.

What a device should run depends on its organisation's releases, groups and pins, and on the
device row (attributes, labels, pin, running version).  The fleet generation is a Redis
counter per organisation that goes up:

- before every fleet-changed hint (gateway.hints: any Release saved or deleted, any
  FleetChanged a service publishes: groups, pins, labels);
- when an assignment row or a device row is deleted, or a device row is saved other than by a
  check-in (the admin's or a shell's full save), in any process that loaded the gateway app.

A device's own check-in changes (attributes, running version, update status) are compared
per device by gateway.checkin_fast, so they need no bump.  Each process keeps a view of the
generations (``generations``): gateway.checkin_fast's refresher re-reads every known one
every quarter second, a bump made in this process lands in it at once, and a computed or a
hinted check-in reads its organisation's afresh.  A database restored underneath running
gateways is only seen after checkin_fast.MAX_AGE_SECONDS (restart them).

Without Redis there is no shared generation, so nothing is remembered and every check-in computes.
"""

from __future__ import annotations

import logging
import threading

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from fleet.models import Device
from releases.models import DeviceAssignment

from gateway.redis_channel import redis_client, redis_url

log = logging.getLogger(__name__)
GENERATION_KEY = "ferry:fleet-generation:{}"
# A device row saved with only these fields is a check-in or a certificate renewal: nothing
# another device's answer depends on, and the device's own next check-in compares them itself.
CHECK_IN_FIELDS = frozenset(
    {
        "last_seen_at",
        "attributes",
        "running_version",
        "certificate_serial",
        "certificate_expires_at",
        "release_key_sequence",
    }
)


def _redis():
    url = redis_url()
    return redis_client(url) if url else None


class Generations:
    """This process's view of the organisations' fleet generations.

    ``observe`` (a bump here, a fresh read) and ``refresh`` (every known one at once) may race:
    each organisation's value carries a sequence number, and a refresh only writes the ones no
    observation changed while its read was in flight, so the view never goes back to a value
    older than one already seen."""

    def __init__(self) -> None:
        self._values: dict[int, int] = {}
        self._sequence: dict[int, int] = {}
        self._lock = threading.Lock()

    def current(self, organisation_id: int) -> int | None:
        return self._values.get(organisation_id)

    def observe(self, organisation_id: int, value: int) -> None:
        with self._lock:
            self._values[organisation_id] = value
            self._sequence[organisation_id] = self._sequence.get(organisation_id, 0) + 1

    def refresh(self) -> bool:
        """Re-read every known organisation's generation (one MGET); False when Redis failed."""
        client = _redis()
        if client is None:
            return False
        with self._lock:
            before = dict(self._sequence)
        if not before:
            return True
        organisations = list(before)
        try:
            values = client.mget([GENERATION_KEY.format(o) for o in organisations])
        except Exception as exc:  # redis raises several types; the fast path stops until it is back
            log.warning("could not read the fleet generations: %s", exc)
            return False
        with self._lock:
            for organisation_id, value in zip(organisations, values, strict=True):
                if self._sequence.get(organisation_id) == before[organisation_id]:
                    self._values[organisation_id] = int(value or 0)
        return True


generations = Generations()


def bump_generation(organisation_id: int) -> None:
    """Make every gateway's remembered answers for this organisation stale (before hinting its devices)."""
    client = _redis()
    if client is None:
        return
    try:
        generations.observe(organisation_id, int(client.incr(GENERATION_KEY.format(organisation_id))))
    except Exception as exc:  # redis raises several types; entries still end at their MAX_AGE_SECONDS
        log.warning("could not bump the fleet generation of organisation %s: %s", organisation_id, exc)


def fleet_generation(organisation_id: int) -> int | None:
    """The organisation's generation read afresh, or None when it cannot be (then nothing is remembered)."""
    client = _redis()
    if client is None:
        return None
    try:
        value = int(client.get(GENERATION_KEY.format(organisation_id)) or 0)
    except Exception as exc:
        log.warning("could not read the fleet generation of organisation %s: %s", organisation_id, exc)
        return None
    generations.observe(organisation_id, value)
    return value


def _bump_on_commit(organisation_id: int | None) -> None:
    if organisation_id is not None:
        transaction.on_commit(lambda: bump_generation(organisation_id))


def _assignment_deleted(sender, instance: DeviceAssignment, **kwargs) -> None:
    # its successor must be issued (with a higher counter), not the deleted one remembered
    _bump_on_commit(
        Device.objects.filter(pk=instance.device_id).values_list("organisation_id", flat=True).first()
    )


def _device_deleted(sender, instance: Device, **kwargs) -> None:
    _bump_on_commit(instance.organisation_id)


def _device_saved(sender, instance: Device, created: bool, update_fields=None, **kwargs) -> None:
    if created or (update_fields is not None and set(update_fields) <= CHECK_IN_FIELDS):
        return
    _bump_on_commit(instance.organisation_id)


post_delete.connect(
    _assignment_deleted,
    sender=DeviceAssignment,
    dispatch_uid="gateway-desired-cache-assignment-deleted",
    weak=False,
)
post_delete.connect(
    _device_deleted, sender=Device, dispatch_uid="gateway-desired-cache-device-deleted", weak=False
)
post_save.connect(_device_saved, sender=Device, dispatch_uid="gateway-desired-cache-device-saved", weak=False)
