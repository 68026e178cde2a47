"""Writes for the fleet: enrolment tokens, enrolment, authentication, check-in."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from ferry_cloud.api_errors import ServiceError
from registry.models import ModelVersion

from fleet.models import Device, EnrolmentToken


class EnrolmentRefused(ServiceError):
    status_code = 403
    code = "enrolment_refused"


class DeviceUnauthenticated(ServiceError):
    status_code = 401
    code = "unauthenticated"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once; only its hash is stored
    record: EnrolmentToken


def enrolment_token_create(
    *, organisation: Organisation, labels: dict[str, str] | None = None, ttl: timedelta = timedelta(days=1)
) -> IssuedToken:
    token = "fet_" + secrets.token_urlsafe(24)
    record = EnrolmentToken.objects.create(
        organisation=organisation,
        token_sha256=_sha256(token),
        labels=labels or {},
        expires_at=timezone.now() + ttl,
    )
    return IssuedToken(token=token, record=record)


@dataclass(frozen=True)
class Enrolment:
    device: Device
    credential: str  # "<device id>.<secret>", shown once


@transaction.atomic
def device_enrol(*, token: str, name: str, attributes: dict[str, str], labels: dict[str, str]) -> Enrolment:
    """Spend a one-time token on a new device and issue its credential."""
    record = EnrolmentToken.objects.select_for_update().filter(token_sha256=_sha256(token)).first()
    now = timezone.now()
    if record is None:
        raise EnrolmentRefused("Unknown enrolment token.")
    if record.used_at is not None:
        raise EnrolmentRefused("This enrolment token has already been used; ask for a new one.")
    if record.expires_at <= now:
        raise EnrolmentRefused("This enrolment token has expired; ask for a new one.")
    secret = secrets.token_urlsafe(32)
    device = Device.objects.create(
        organisation=record.organisation,
        name=name or "device",
        credential_sha256=_sha256(secret),
        attributes=attributes,
        labels={**labels, **record.labels},
        last_seen_at=now,
    )
    record.used_at = now
    record.save(update_fields=["used_at"])
    return Enrolment(device=device, credential=f"{device.id}.{secret}")


def device_authenticate(*, credential: str) -> Device:
    device_id, _, secret = credential.partition(".")
    try:
        device = Device.objects.select_related("organisation").get(pk=device_id)
    except (Device.DoesNotExist, ValueError, ValidationError):
        raise DeviceUnauthenticated("Unknown device credential.") from None
    if not hmac.compare_digest(device.credential_sha256, _sha256(secret)):
        raise DeviceUnauthenticated("Unknown device credential.")
    if device.revoked_at is not None:
        raise DeviceUnauthenticated("This device has been revoked.")
    return device


def device_revoke(*, device: Device) -> None:
    Device.objects.filter(pk=device.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def device_record_check_in(*, device: Device, attributes: dict[str, str], running_version_id: str) -> Device:
    """Store what the device says it is and runs."""
    running = None
    if running_version_id:
        running = ModelVersion.objects.filter(
            pk=running_version_id, model__organisation=device.organisation
        ).first()
    device.attributes = attributes or device.attributes
    device.running_version = running
    device.last_seen_at = timezone.now()
    device.save(update_fields=["attributes", "running_version", "last_seen_at"])
    return device
