"""Writes for the fleet: enrolment tokens, enrolment and client certificates, check-in."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from accounts.models import Organisation
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from ferry_cloud import events
from ferry_cloud.device_ca import device_ca, device_ca_certificate
from ferry_cloud.errors import Conflict, Invalid, PermissionDenied, Unauthenticated
from ferry_cloud.events import FleetChanged, publish
from registry.models import ModelVersion

from deploy.errors import PolicyError
from deploy.filters import Filter
from deploy.trust.bundle import EnrolmentBundle, encode_bundle
from deploy.trust.certificates import CertificateError, IssuedCertificate, load_csr, sign_client_certificate
from deploy.windows import MaintenanceWindow
from fleet.models import Device, DeviceGroup, DeviceVersionChange, EnrolmentToken


class EnrolmentRefused(PermissionDenied):
    code = "enrolment_refused"


class DeviceUnauthenticated(Unauthenticated):
    code = "unauthenticated"


class DeviceRevoked(PermissionDenied):
    code = "device_revoked"


class InvalidCertificateRequest(Invalid):
    code = "invalid_csr"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once; only its hash is stored
    record: EnrolmentToken


def enrolment_token_create(
    *, organisation: Organisation, labels: dict[str, str] | None = None, ttl: timedelta | None = None
) -> IssuedToken:
    """A one-time token (192 random bits, kept as its sha256) that expires after ``ttl``
    (default FERRY_ENROLMENT_TOKEN_HOURS, 24)."""
    if ttl is None:
        ttl = timedelta(hours=settings.FERRY_ENROLMENT_TOKEN_HOURS)
    token = "fet_" + secrets.token_urlsafe(24)
    record = EnrolmentToken.objects.create(
        organisation=organisation,
        token_sha256=_sha256(token),
        labels=labels or {},
        expires_at=timezone.now() + ttl,
    )
    return IssuedToken(token=token, record=record)


def enrolment_bundle(*, token: str, gateway_address: str, enrol_address: str) -> str:
    """The one line a device enrols with: the gateway's two addresses, the token and this control
    plane's device CA (deploy/trust/bundle.py)."""
    return encode_bundle(
        EnrolmentBundle(
            gateway=gateway_address, enrol=enrol_address, token=token, ca_pem=device_ca_certificate()
        )
    )


def enrolment_bundle_for_token(token: str) -> str:
    """The bundle for token at the gateway's public addresses; "" when they are not configured."""
    gateway = settings.FERRY_GATEWAY_PUBLIC_ADDRESS
    enrol = settings.FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS
    if not gateway or not enrol:
        return ""
    return enrolment_bundle(token=token, gateway_address=gateway, enrol_address=enrol)


@dataclass(frozen=True)
class Enrolment:
    device: Device
    certificate: IssuedCertificate | None  # None when no CSR was sent (tests, imports)


def _issue(device: Device, csr_der: bytes) -> IssuedCertificate:
    """Sign the device's CSR into a client certificate naming it, and remember serial and expiry."""
    try:
        issued = sign_client_certificate(
            device_ca(),
            csr_der,
            device_id=str(device.pk),
            lifetime=timedelta(hours=settings.FERRY_DEVICE_CERT_HOURS),
        )
    except CertificateError as exc:
        raise InvalidCertificateRequest(f"Bad certificate request: {exc}") from None
    device.certificate_serial = issued.serial
    device.certificate_expires_at = issued.not_after
    device.save(update_fields=["certificate_serial", "certificate_expires_at"])
    return issued


@transaction.atomic
def device_enrol(
    *, token: str, name: str, attributes: dict[str, str], labels: dict[str, str], csr_der: bytes = b""
) -> Enrolment:
    """Spend a one-time token on a new device and, given its CSR, issue its client certificate.

    The token row is locked, so two concurrent enrolments with one token cannot both succeed;
    a bad CSR rolls the whole enrolment back and leaves the token unspent."""
    if csr_der:
        load_csr_or_refuse(csr_der)  # refuse a bad CSR before the token is looked at
    record = EnrolmentToken.objects.select_for_update().filter(token_sha256=_sha256(token)).first()
    now = timezone.now()
    if record is None:
        raise EnrolmentRefused("Unknown enrolment token.")
    if record.used_at is not None:
        raise EnrolmentRefused("This enrolment token has already been used; ask for a new one.")
    if record.expires_at <= now:
        raise EnrolmentRefused("This enrolment token has expired; ask for a new one.")
    device = Device.objects.create(
        organisation=record.organisation,
        name=name or "device",
        attributes=attributes,
        labels={**labels, **record.labels},
        last_seen_at=now,
    )
    record.used_at = now
    record.save(update_fields=["used_at"])
    return Enrolment(device=device, certificate=_issue(device, csr_der) if csr_der else None)


def load_csr_or_refuse(csr_der: bytes) -> None:
    try:
        load_csr(csr_der)
    except CertificateError as exc:
        raise InvalidCertificateRequest(f"Bad certificate request: {exc}") from None


def device_for_certificate(*, device_id: str) -> Device:
    """The device a verified client certificate names; revoked devices are refused."""
    try:
        device = Device.objects.select_related("organisation").get(pk=device_id)
    except (Device.DoesNotExist, ValueError, ValidationError):
        raise DeviceUnauthenticated(
            "This client certificate names no device of this control plane."
        ) from None
    if device.revoked_at is not None:
        raise DeviceRevoked("This device has been revoked; enrol it again with a new token.")
    return device


def device_renew_certificate(*, device: Device, csr_der: bytes) -> IssuedCertificate:
    """A fresh client certificate for a (still valid, not revoked) device's new key."""
    device = device_for_certificate(device_id=str(device.pk))
    return _issue(device, csr_der)


def device_revoke(*, device: Device) -> None:
    Device.objects.filter(pk=device.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    # announced even if it was revoked already: forgetting it twice costs nothing
    publish(events.DeviceRevoked(organisation_id=device.organisation_id, device_id=str(device.pk)))


# A check-in that changes nothing writes nothing, except last_seen_at at this resolution.
LAST_SEEN_RESOLUTION = timedelta(seconds=60)


def _reported_version(device: Device, running_version_id: str) -> ModelVersion | None:
    if not running_version_id:
        return None
    try:
        return ModelVersion.objects.filter(
            pk=running_version_id, model__organisation=device.organisation
        ).first()
    except (ValidationError, ValueError):  # a malformed id is "nothing we know of"
        return None


def device_record_check_in(
    *, device: Device, attributes: dict[str, str], running_version_id: str, release_key_sequence: int = 0
) -> Device:
    """Store what the device says it is and runs; cheap when nothing changed (no query, no write)."""
    changed: list[str] = []
    if release_key_sequence != device.release_key_sequence:  # who is behind on rotations shows
        device.release_key_sequence = release_key_sequence
        changed.append("release_key_sequence")
    if running_version_id != (str(device.running_version_id) if device.running_version_id else ""):
        running = _reported_version(device, running_version_id)
        if (running.pk if running else None) != device.running_version_id:
            # the history rollbacks read: what the device ran before a release reached it
            DeviceVersionChange.objects.create(
                device=device, from_version_id=device.running_version_id, to_version=running
            )
            device.running_version = running
            changed.append("running_version")
    if attributes and attributes != device.attributes:
        device.attributes = attributes
        changed.append("attributes")
    now = timezone.now()
    if changed or device.last_seen_at is None or now - device.last_seen_at >= LAST_SEEN_RESOLUTION:
        device.last_seen_at = now
        changed.append("last_seen_at")
    if changed:
        device.save(update_fields=changed)
    return device


# --- groups and pins ----------------------------------------------------------------------


class InvalidGroup(Invalid):
    code = "invalid_group"


class InvalidPin(Invalid):
    code = "invalid_pin"


def _check_group_fields(*, kind: str, filter_text: str, window: dict | None) -> str:
    if kind not in DeviceGroup.Kind.values:
        raise InvalidGroup(f"Group kind must be one of {', '.join(DeviceGroup.Kind.values)}, got {kind!r}.")
    canonical = ""
    if kind == DeviceGroup.Kind.DYNAMIC:
        if not filter_text.strip():
            raise InvalidGroup(
                "A dynamic group needs a filter, e.g. 'hardware == rpi4 and region == eu-west'."
            )
        try:
            canonical = Filter.parse(filter_text).text
        except PolicyError as exc:
            raise InvalidGroup(f"Invalid filter: {exc}") from None
    elif filter_text.strip():
        raise InvalidGroup("Only dynamic groups have a filter; a static group lists its members.")
    try:
        MaintenanceWindow.from_dict(window)
    except PolicyError as exc:
        raise InvalidGroup(f"Invalid window: {exc}") from None
    return canonical


def _version_of(organisation: Organisation, version_id) -> ModelVersion | None:
    if version_id in (None, ""):
        return None
    try:
        version = ModelVersion.objects.get(pk=version_id, model__organisation=organisation)
    except (ModelVersion.DoesNotExist, ValueError, ValidationError):
        raise InvalidPin(f"No version {version_id} in this organisation.") from None
    if version.package_id is None:
        raise InvalidPin(f"Version {version} has no package yet; only a converted version can be pinned.")
    return version


def version_for_pin(*, organisation: Organisation, version_id) -> ModelVersion | None:
    """The version a pin would use (None for None); InvalidPin if it is not a converted one of ours."""
    return _version_of(organisation, version_id)


def _devices_of(organisation: Organisation, device_ids: list) -> list[Device]:
    ids = {str(d) for d in device_ids}
    try:
        devices = list(Device.objects.filter(organisation=organisation, pk__in=ids))
    except (ValueError, ValidationError):
        raise InvalidGroup("Device ids must be UUIDs.") from None
    missing = ids - {str(d.pk) for d in devices}
    if missing:
        raise InvalidGroup(f"No device(s) {', '.join(sorted(missing))} in this organisation.")
    return devices


@transaction.atomic
def device_group_create(
    *,
    organisation: Organisation,
    name: str,
    kind: str = DeviceGroup.Kind.STATIC,
    filter_text: str = "",
    device_ids: list | None = None,
    window: dict | None = None,
    pinned_version_id=None,
) -> DeviceGroup:
    canonical = _check_group_fields(kind=kind, filter_text=filter_text, window=window)
    if DeviceGroup.objects.filter(organisation=organisation, name=name).exists():
        raise InvalidGroup(f"A group named {name!r} exists already.")
    if device_ids and kind == DeviceGroup.Kind.DYNAMIC:
        raise InvalidGroup("A dynamic group's members come from its filter; do not list devices.")
    group = DeviceGroup.objects.create(
        organisation=organisation,
        name=name,
        kind=kind,
        filter=canonical,
        window=window or {},
        pinned_version=_version_of(organisation, pinned_version_id),
    )
    if device_ids:
        group.members.set(_devices_of(organisation, device_ids))
    publish(FleetChanged(organisation_id=organisation.pk))
    return group


@transaction.atomic
def device_group_update(*, group: DeviceGroup, **changes) -> DeviceGroup:
    """Change any of name, filter_text, window, pinned_version_id, add_device_ids, remove_device_ids."""
    unknown = set(changes) - {
        "name",
        "filter_text",
        "window",
        "pinned_version_id",
        "add_device_ids",
        "remove_device_ids",
    }
    if unknown:
        raise InvalidGroup(f"Unknown group field(s): {', '.join(sorted(unknown))}.")
    group = DeviceGroup.objects.select_for_update().get(pk=group.pk)
    filter_text = changes.get("filter_text", group.filter)
    window = changes.get("window", group.window)
    group.filter = _check_group_fields(kind=group.kind, filter_text=filter_text, window=window)
    group.window = window or {}
    if "name" in changes:
        if (
            DeviceGroup.objects.filter(organisation=group.organisation, name=changes["name"])
            .exclude(pk=group.pk)
            .exists()
        ):
            raise InvalidGroup(f"A group named {changes['name']!r} exists already.")
        group.name = changes["name"]
    if "pinned_version_id" in changes:
        group.pinned_version = _version_of(group.organisation, changes["pinned_version_id"])
    group.save()
    for key, method in (("add_device_ids", group.members.add), ("remove_device_ids", group.members.remove)):
        if changes.get(key):
            if group.kind == DeviceGroup.Kind.DYNAMIC:
                raise InvalidGroup(
                    "A dynamic group's members come from its filter; change the filter instead."
                )
            method(*_devices_of(group.organisation, changes[key]))
    publish(FleetChanged(organisation_id=group.organisation_id))
    return group


def device_group_delete(*, group: DeviceGroup) -> None:
    from releases.models import Release  # releases depend on fleet, not the other way round

    live = Release.objects.filter(organisation=group.organisation).exclude(
        state__in=["aborted", "rolled_back"]
    )
    # JSON "contains" lookups do not work on SQLite: look in Python (an organisation has few releases)
    if any(str(group.pk) in (r.target or {}).get("group_ids", []) for r in live.only("target")):
        raise InvalidGroup(
            f"Group {group.name} is targeted by a release; abort or finish that release first."
        )
    group.delete()
    publish(FleetChanged(organisation_id=group.organisation_id))


def device_pin(*, device: Device, version_id) -> Device:
    """Pin the device to a version (None unpins): it runs that version whatever the releases say."""
    device.pinned_version = _version_of(device.organisation, version_id)
    device.save(update_fields=["pinned_version"])
    publish(FleetChanged(organisation_id=device.organisation_id))
    return device


def device_labels_set(*, device: Device, labels: dict[str, str]) -> Device:
    """Replace the device's labels (filters, groups and release targets read them live)."""
    device.labels = dict(labels)
    device.save(update_fields=["labels"])
    publish(FleetChanged(organisation_id=device.organisation_id))
    return device


class EnrolmentTokenUsed(Conflict):
    code = "enrolment_token_used"


def enrolment_token_revoke(*, record: EnrolmentToken) -> EnrolmentToken:
    """Make an unused token unusable now (it expires); revoking it again changes nothing."""
    if record.used_at is not None:
        raise EnrolmentTokenUsed("This token has already enrolled a device; revoke that device instead.")
    now = timezone.now()
    EnrolmentToken.objects.filter(pk=record.pk, used_at__isnull=True, expires_at__gt=now).update(
        expires_at=now
    )
    record.refresh_from_db()
    return record
