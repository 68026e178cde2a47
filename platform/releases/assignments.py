"""Signed per-device assignments: the director role of Ferry's trust model (deploy/trust).

What a device should run (releases.selectors.desired_package_for) becomes an assignment the
control plane signs for that device alone, with a counter that only goes up.  The device acts
only on the signed assignment, so a rollback, a re-release, a pin or an unpin is just a new
assignment with a higher counter, and a replayed old one is refused on the device.

A check-in whose desired state is unchanged reuses the stored assignment (one query) while
more than half of its lifetime remains; anything else issues a new one under the row lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from ferry_cloud.release_key import release_private_key
from fleet.models import Device
from registry.services import package_manifest_sha256

from deploy.trust.assignment import Assignment, sign_assignment
from releases.models import DeviceAssignment
from releases.selectors import DesiredPackage, desired_package_for


@dataclass(frozen=True)
class IssuedAssignment:
    """The desired package (for the offer's display fields) and its signed assignment."""

    desired: DesiredPackage
    blob: bytes
    signature: bytes
    counter: int
    fresh_until: float = 0.0  # after this (half its lifetime) a check-in gets a new one


def _wanted(desired: DesiredPackage) -> tuple:
    """What an assignment must say for this desired state (compared with the stored row)."""
    release_id = desired.release.pk if desired.release is not None else None
    return (
        desired.version.pk,
        release_id,
        desired.version.package.sha256,
        desired.rollback,
        desired.download_only,
        desired.window or None,
    )


def _held(row: DeviceAssignment) -> tuple:
    return (
        row.version_id,
        row.release_id,
        row.package_digest,
        row.rollback,
        row.download_only,
        row.window or None,
    )


def _fresh(row: DeviceAssignment, now: float) -> bool:
    """More than half the lifetime left: a device offline for a while still gets a valid one."""
    return row.expires_at.timestamp() - now > settings.FERRY_ASSIGNMENT_TTL_SECONDS / 2


def _next_counter(last: int, now: float) -> int:
    # Wall-clock milliseconds, not just last + 1: a database restored from a backup forgets the
    # counters issued since, but devices remember the highest they accepted, so a plain
    # increment would reissue counters they refuse as replays.  Time keeps moving forward
    # across a restore; last + 1 keeps the order when two changes land in one millisecond.
    return max(last + 1, int(now * 1000))


def assignment_for(device: Device) -> IssuedAssignment | None:
    """The device's current signed assignment, issuing a new one if what it should run changed;
    None when nothing is decided for it (it keeps what it runs)."""
    desired = desired_package_for(device)
    if desired is None:
        return None
    row = DeviceAssignment.objects.filter(device_id=device.pk).first()
    if row is not None and _held(row) == _wanted(desired) and _fresh(row, time.time()):
        return _reused(desired, row)
    return _issue(device, desired)


def _half_life(expires_at: float) -> float:
    return expires_at - settings.FERRY_ASSIGNMENT_TTL_SECONDS / 2


def _reused(desired: DesiredPackage, row: DeviceAssignment) -> IssuedAssignment:
    return IssuedAssignment(
        desired, bytes(row.blob), bytes(row.signature), row.counter, _half_life(row.expires_at.timestamp())
    )


def _manifest_sha256(desired: DesiredPackage) -> str:
    package = desired.version.package
    known = (
        DeviceAssignment.objects.filter(package_digest=package.sha256)
        .values_list("manifest_sha256", flat=True)
        .first()
    )
    return known or package_manifest_sha256(artifact=package)


def _issue(device: Device, desired: DesiredPackage) -> IssuedAssignment:
    manifest_sha256 = _manifest_sha256(desired)  # may read object storage: outside the lock
    package = desired.version.package
    with transaction.atomic():
        row = DeviceAssignment.objects.select_for_update().filter(device_id=device.pk).first()
        now = time.time()
        if row is not None and _held(row) == _wanted(desired) and _fresh(row, now):
            return _reused(desired, row)  # a racer did it
        issued_at = int(now)
        assignment = Assignment(
            device_id=str(device.pk),
            organisation_id=str(device.organisation_id),
            counter=_next_counter(row.counter if row is not None else 0, now),
            issued_at=issued_at,
            expires_at=issued_at + settings.FERRY_ASSIGNMENT_TTL_SECONDS,
            version_id=str(desired.version.pk),
            release_id=str(desired.release.pk) if desired.release is not None else "",
            package_digest=package.sha256,
            package_size=package.size,
            manifest_sha256=manifest_sha256,
            rollback=desired.rollback,
            download_only=desired.download_only,
            window=desired.window or None,
        )
        blob, signature = sign_assignment(assignment, release_private_key())
        digests = list(row.assigned_digests) if row is not None else []
        if package.sha256 not in digests:
            digests.append(package.sha256)
        DeviceAssignment.objects.update_or_create(
            device_id=device.pk,
            defaults=dict(
                counter=assignment.counter,
                blob=blob,
                signature=signature,
                version=desired.version,
                release=desired.release,
                package_digest=package.sha256,
                manifest_sha256=manifest_sha256,
                rollback=desired.rollback,
                download_only=desired.download_only,
                window=desired.window or None,
                issued_at=datetime.fromtimestamp(issued_at, UTC),
                expires_at=datetime.fromtimestamp(assignment.expires_at, UTC),
                assigned_digests=digests,
            ),
        )
    return IssuedAssignment(desired, blob, signature, assignment.counter, _half_life(assignment.expires_at))


def package_assigned_to(device: Device, package_digest: str) -> bool:
    """Whether the package was ever assigned to this device: the only ones it may download.
    Read and checked here, not with a JSON ``contains`` lookup: the demo runs on SQLite."""
    digests = (
        DeviceAssignment.objects.filter(device_id=device.pk)
        .values_list("assigned_digests", flat=True)
        .first()
    )
    return isinstance(digests, list) and package_digest in digests
