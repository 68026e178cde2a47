"""Bulk device operations: pin, unpin, label or revoke every device a filter (or a list) selects.

The single-device services do the work (device_pin, device_labels_set, device_revoke), so a
bulk pin announces and checks exactly what a pin does; this module only selects, counts, caps
and audits: a BulkAction row, and one typed event in the organisation's feed (devices.bulk_pin,
...), which webhooks subscribed to that type receive. A dry run selects and counts and changes
nothing. All or nothing: one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accounts.models import Organisation
from django.db import transaction
from ferry_cloud.errors import Invalid
from ferry_cloud.events import AuditEventRecorded, publish

from fleet import selectors, services
from fleet.models import BulkAction, Device

MAX_DEVICES = 10_000  # per call: a larger change is a device group's (or a release's) job
ACTIONS = ("pin", "unpin", "label", "revoke")
MAX_LABELS = 64  # a device's labels at most, as the single-device edit allows
AUDITED_IDS = 100  # listed ids carried in the feed's event (and each webhook's body)


class InvalidBulkAction(Invalid):
    code = "invalid_bulk_action"


class TooManyDevices(Invalid):
    code = "too_many_devices"


@dataclass(frozen=True)
class BulkOutcome:
    matched: int  # devices the selection named (live ones for a filter)
    changed: int  # of those, the ones the action changed (or would change, on a dry run)


def _selected(
    organisation: Organisation, filter_text: str | None, device_ids: list[str] | None
) -> list[Device]:
    if (filter_text is None) == (device_ids is None):
        raise InvalidBulkAction('Give either "filter" or "device_ids", not both and not neither.')
    if filter_text is not None:
        device_ids = selectors.devices_matching(organisation_id=organisation.pk, filter_text=filter_text)
    if len(device_ids) > MAX_DEVICES:
        raise TooManyDevices(
            f"The selection has {len(device_ids)} devices; a bulk operation takes at most {MAX_DEVICES}. "
            "Narrow the filter, or use a device group or a release for the whole fleet."
        )
    devices = selectors.devices_by_ids(organisation=organisation, device_ids=[str(d) for d in device_ids])
    if filter_text is None and len(devices) != len(set(map(str, device_ids))):
        found = {str(d.pk) for d in devices}
        missing = sorted({str(d) for d in device_ids} - found)
        raise InvalidBulkAction(f"No device(s) {', '.join(missing[:10])} in this organisation.")
    return devices


def _changes(device: Device, action: str, version_id: str | None, labels: dict[str, Any]) -> bool:
    """Whether the action would change this device."""
    if action == "pin":
        return str(device.pinned_version_id) != str(version_id)
    if action == "unpin":
        return device.pinned_version_id is not None
    if action == "label":
        return _labelled(device.labels, labels) != (device.labels or {})
    return device.revoked_at is None  # revoke


def _labelled(current: dict[str, str] | None, changes: dict[str, str | None]) -> dict[str, str]:
    """The labels after a bulk label: each given label set, each given as null removed."""
    merged = dict(current or {})
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _check_arguments(organisation: Organisation, action: str, version_id, labels) -> None:
    if action not in ACTIONS:
        raise InvalidBulkAction(f"Unknown action {action!r}; use one of {', '.join(ACTIONS)}.")
    if action == "pin":
        if version_id is None:
            raise InvalidBulkAction('pin needs "version": the version to pin the devices to.')
        services.version_for_pin(organisation=organisation, version_id=version_id)
    elif version_id is not None:
        raise InvalidBulkAction('"version" is for pin only.')
    if action == "label" and not labels:
        raise InvalidBulkAction('label needs "labels": the labels to set (null removes one).')
    if action != "label" and labels:
        raise InvalidBulkAction('"labels" is for label only.')


@transaction.atomic
def devices_bulk(
    *,
    organisation: Organisation,
    action: str,
    filter_text: str | None = None,
    device_ids: list[str] | None = None,
    version_id: str | None = None,
    labels: dict[str, str | None] | None = None,
    dry_run: bool = False,
    actor=None,
) -> BulkOutcome:
    """Apply ``action`` to the selected devices (or count what it would do); audited unless a dry run.

    PolicyError for a malformed filter, TooManyDevices above MAX_DEVICES, InvalidBulkAction or
    InvalidPin for arguments that do not fit the action. Revoking needs an admin: the door checks.
    """
    labels = labels or {}
    _check_arguments(organisation, action, version_id, labels)
    devices = _selected(organisation, filter_text, device_ids)
    targets = [d for d in devices if _changes(d, action, version_id, labels)]
    crowded = [d.name for d in targets if action == "label" and len(_labelled(d.labels, labels)) > MAX_LABELS]
    if crowded:  # the single-device edit refuses more too
        raise InvalidBulkAction(
            f"{len(crowded)} device(s) would have more than {MAX_LABELS} labels (e.g. {crowded[0]!r}); "
            "remove some (a null value removes one)."
        )
    if dry_run:
        return BulkOutcome(matched=len(devices), changed=len(targets))
    for device in targets:
        if action in ("pin", "unpin"):
            services.device_pin(device=device, version_id=version_id if action == "pin" else None)
        elif action == "label":
            services.device_labels_set(device=device, labels=_labelled(device.labels, labels))
        else:
            services.device_revoke(device=device)
    record = BulkAction.objects.create(
        organisation=organisation,
        actor=actor,
        action=action,
        filter=filter_text or "",
        device_ids=[str(d) for d in device_ids or []],
        version_id=version_id,
        labels=labels,
        matched=len(devices),
        changed=len(targets),
    )
    _audit(record)
    return BulkOutcome(matched=len(devices), changed=len(targets))


def _audit(record: BulkAction) -> None:
    """The bulk action as one event of the organisation's feed (GET /api/v1/audit/, the stream,
    webhooks subscribed to its type), in the same transaction as the change it records."""
    from releases.models import ReleaseEvent  # releases depend on fleet, not the other way round

    ids = record.device_ids
    selection = f"matching {record.filter}" if record.filter else f"of {len(ids)} listed"
    event = ReleaseEvent.objects.create(
        organisation_id=record.organisation_id,
        release=None,
        action=f"bulk_{record.action}",
        from_state="",
        to_state="",
        actor=record.actor,
        reason=f"{record.action}: {record.changed} of {record.matched} device(s) {selection} changed",
        details={
            "bulk_action": record.pk,
            "action": record.action,
            "filter": record.filter or None,
            "device_ids": ids[:AUDITED_IDS],
            "device_ids_given": len(ids),  # the full list stays on the BulkAction row
            "version": str(record.version_id) if record.version_id else None,
            "labels": record.labels,
            "matched": record.matched,
            "changed": record.changed,
        },
    )
    publish(AuditEventRecorded(organisation_id=record.organisation_id, event_id=event.pk))
