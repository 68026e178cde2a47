"""Per-device release status: what each agent reports about its update at every check-in.

A report is validated field by field (the gateway calls ``update_report_from`` where the
request lands), then mapped to the release that assigned its version and stored, one row
per release and device. A device's move to refused, failed or rolled_back is written to the
release's audit log with its reason; the gate evaluation counts those devices as failures.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import IntegrityError, transaction
from ferry_cloud.errors import Invalid
from ferry_cloud.events import AuditEventRecorded, publish
from fleet.models import Device

from releases.models import DeviceReleaseStatus, Release, ReleaseEvent
from releases.selectors import LIVE_STATES

REPORTED_STATES = frozenset(
    s for s in DeviceReleaseStatus.State.values if s != DeviceReleaseStatus.State.PENDING
)
FAILED_STATES = ("refused", "failed", "rolled_back")
MAX_MESSAGE = 500
MAX_REASON_CODE = 32
MAX_COUNTER = 2**63 - 1  # the column is a signed bigint
REASON_CODE = re.compile(r"^[a-z][a-z0-9_]*$")
# a device clock before the product existed or far in the future is wrong, not a time
EARLIEST, LATEST = datetime(2000, 1, 1, tzinfo=UTC).timestamp(), datetime(2200, 1, 1, tzinfo=UTC).timestamp()


class InvalidUpdateStatus(Invalid):
    code = "invalid_update_status"


@dataclass(frozen=True)
class UpdateReport:
    """One agent's UpdateStatus, validated."""

    state: str
    version_id: str
    release_id: str
    assignment_counter: int
    reason_code: str
    message: str
    at: datetime | None


def _refuse(field: str, problem: str) -> InvalidUpdateStatus:
    return InvalidUpdateStatus(f"update.{field} {problem}", fields={f"update.{field}": [problem]})


def _uuid_or_empty(field: str, value: str) -> str:
    if not value:
        return ""
    try:
        parsed = uuid.UUID(value) if len(value) == 36 else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise _refuse(field, "must be a UUID (8-4-4-4-12 hex digits) or empty")
    return str(parsed)


def update_report_from(
    *,
    state: str,
    version_id: str,
    release_id: str,
    assignment_counter: int,
    reason_code: str,
    message: str,
    at: float,
) -> UpdateReport:
    """Check every field of an agent's UpdateStatus; InvalidUpdateStatus names the first bad one."""
    if state not in REPORTED_STATES:
        raise _refuse("state", f"must be one of {', '.join(sorted(REPORTED_STATES))}, not {state[:40]!r}")
    version_id = _uuid_or_empty("version_id", version_id)
    release_id = _uuid_or_empty("release_id", release_id)
    if state != "idle" and not version_id:
        raise _refuse("version_id", f"is required in state {state!r}")
    if not 0 <= assignment_counter <= MAX_COUNTER:
        raise _refuse("assignment_counter", f"must be between 0 and {MAX_COUNTER}")
    if len(reason_code) > MAX_REASON_CODE or (reason_code and not REASON_CODE.match(reason_code)):
        raise _refuse(
            "reason_code", f"must be at most {MAX_REASON_CODE} characters of a-z, 0-9 and _, starting a-z"
        )
    if len(message) > MAX_MESSAGE:
        raise _refuse("message", f"must be at most {MAX_MESSAGE} characters, got {len(message)}")
    if "\x00" in message:
        raise _refuse("message", "must not contain NUL characters")
    if not math.isfinite(at) or (at and not EARLIEST <= at <= LATEST):
        raise _refuse("at", "must be seconds since the epoch between 2000 and 2200, or 0")
    return UpdateReport(
        state=state,
        version_id=version_id,
        release_id=release_id,
        assignment_counter=int(assignment_counter),
        reason_code=reason_code,
        message=message,
        at=datetime.fromtimestamp(at, tz=UTC) if at else None,
    )


def release_for_report(*, device: Device, report: UpdateReport) -> Release | None:
    """The release that assigned the reported version to this device, or None (a pin, nothing).

    The release the agent names wins when it is one of the device's organisation's and it
    released that version (or the report is a rollback it ordered); otherwise the newest live
    release of that version in the organisation.
    """
    if not report.version_id:
        return None
    releases = Release.objects.filter(organisation_id=device.organisation_id, state__in=LIVE_STATES)
    if report.release_id:
        named = releases.filter(pk=report.release_id).first()
        if named is not None and (
            str(named.version_id) == report.version_id or report.state == "rolled_back"
        ):
            return named
    return releases.filter(version_id=report.version_id).order_by("-created_at").first()


def device_status_record(*, device: Device, report: UpdateReport) -> DeviceReleaseStatus | None:
    """Store the report on the release it is about; a move into refused, failed or rolled_back
    (or a new reason for one) is audited on the release. Repeating a report changes nothing."""
    release = release_for_report(device=device, report=report)
    if release is None:
        return None
    try:
        return _upsert(release, device, report)
    except IntegrityError:  # two check-ins of one device raced to create the row: update it
        return _upsert(release, device, report)


@transaction.atomic
def _upsert(release: Release, device: Device, report: UpdateReport) -> DeviceReleaseStatus:
    row = DeviceReleaseStatus.objects.select_for_update().filter(release=release, device=device).first()
    before = (row.state, row.reason_code) if row else None
    values = {
        "state": report.state,
        "reason_code": report.reason_code,
        "message": report.message,
        "assignment_counter": report.assignment_counter,
        "reported_at": report.at,
    }
    if row is None:
        with transaction.atomic():  # a savepoint: a racing insert fails alone
            row = DeviceReleaseStatus.objects.create(release=release, device=device, **values)
    elif any(getattr(row, name) != value for name, value in values.items()):
        for name, value in values.items():
            setattr(row, name, value)
        row.save()  # an unchanged report (most check-ins) writes nothing
    if report.state in FAILED_STATES and before != (report.state, report.reason_code):
        event = ReleaseEvent.objects.create(
            release=release,
            action=f"device_{report.state}",
            from_state=release.state,
            to_state=release.state,
            from_phase=release.current_phase,
            to_phase=release.current_phase,
            reason=f"device {device.name}: {report.reason_code or 'no reason code'}: {report.message}"[:1000],
            details={
                "device_id": str(device.pk),
                "device_name": device.name,
                "state": report.state,
                "reason_code": report.reason_code,
                "version_id": report.version_id,
                "assignment_counter": report.assignment_counter,
            },
        )
        publish(AuditEventRecorded(organisation_id=release.organisation_id, event_id=event.pk))
    return row
