"""Reads for the fleet."""

from __future__ import annotations

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from ferry_cloud.errors import NotFound

from deploy.filters import Filter
from fleet.models import Device, DeviceGroup, DeviceVersionChange, EnrolmentToken


def device_list(*, organisation: Organisation) -> QuerySet[Device]:
    """The organisation's devices with their versions and, as ``telemetry_count``, how many
    telemetry records each has stored (counted in the same query)."""
    return (
        Device.objects.filter(organisation=organisation)
        .select_related("running_version__model", "pinned_version__model")
        .annotate(telemetry_count=Count("telemetry"))
    )


def devices_per_version(*, organisation: Organisation) -> list[dict]:
    """[{"version": "model:label" or None, "devices": n}], the fleet's current spread."""
    rows = (
        Device.objects.filter(organisation=organisation, revoked_at__isnull=True)
        .values("running_version__model__name", "running_version__label")
        .annotate(devices=Count("id"))
        .order_by("running_version__model__name", "running_version__label")
    )
    return [
        {
            "version": (
                f"{r['running_version__model__name']}:{r['running_version__label']}"
                if r["running_version__label"]
                else None
            ),
            "devices": r["devices"],
        }
        for r in rows
    ]


def device_group_list(*, organisation: Organisation) -> QuerySet[DeviceGroup]:
    return DeviceGroup.objects.filter(organisation=organisation).select_related("pinned_version__model")


def device_group_get(*, organisation: Organisation, group_id) -> DeviceGroup:
    try:
        return device_group_list(organisation=organisation).get(pk=group_id)
    except (DeviceGroup.DoesNotExist, ValueError, ValidationError):
        raise NotFound(f"No device group {group_id} in this organisation.") from None


def device_get(*, organisation: Organisation, device_id) -> Device:
    try:
        return device_list(organisation=organisation).get(pk=device_id)
    except (Device.DoesNotExist, ValueError, ValidationError):
        raise NotFound(f"No device {device_id} in this organisation.") from None


def devices_matching(*, organisation_id, filter_text: str) -> list[str]:
    """Ids of the organisation's live devices the filter selects now; PolicyError if it is malformed."""
    matches = Filter.parse(filter_text)
    return _matching(matches, _live_device_facts(organisation_id))


def _live_device_facts(organisation_id) -> list[tuple]:
    devices = Device.objects.filter(organisation_id=organisation_id, revoked_at__isnull=True)
    return list(devices.values_list("pk", "attributes", "labels"))


def _matching(matches: Filter, devices: list[tuple]) -> list[str]:
    """Ids of the (pk, attributes, labels) rows the parsed filter selects."""
    return [
        str(pk)
        for pk, attributes, labels in devices
        if matches(
            {str(k): str(v) for k, v in (attributes or {}).items()},
            {str(k): str(v) for k, v in (labels or {}).items()},
        )
    ]


def device_group_members(*, groups: list[DeviceGroup]) -> dict:
    """{group id: member ids} for many groups in two queries: static memberships at once, and the
    live devices once for every dynamic group's filter."""
    members: dict = {g.pk: [] for g in groups}
    static = [g.pk for g in groups if g.kind == DeviceGroup.Kind.STATIC]
    through = DeviceGroup.members.through.objects.filter(devicegroup_id__in=static)
    for group_id, device_id in through.values_list("devicegroup_id", "device_id"):
        members[group_id].append(str(device_id))
    dynamic = [g for g in groups if g.kind != DeviceGroup.Kind.STATIC]
    if dynamic:
        devices = list(
            Device.objects.filter(
                organisation_id=dynamic[0].organisation_id, revoked_at__isnull=True
            ).values_list("pk", "attributes", "labels")
        )
        for group in dynamic:
            matches = Filter.parse(group.filter)
            members[group.pk] = [
                str(pk)
                for pk, attributes, labels in devices
                if matches(
                    {str(k): str(v) for k, v in (attributes or {}).items()},
                    {str(k): str(v) for k, v in (labels or {}).items()},
                )
            ]
    return members


def device_group_member_ids(*, group: DeviceGroup) -> list[str]:
    """Static members, or for a dynamic group the devices its filter matches right now."""
    if group.kind == DeviceGroup.Kind.STATIC:
        return [str(pk) for pk in group.members.values_list("pk", flat=True)]
    return devices_matching(organisation_id=group.organisation_id, filter_text=group.filter)


def device_list_filtered(
    *,
    organisation: Organisation,
    filter_text: str = "",
    group_id=None,
    version_id=None,
    last_seen_after=None,
    last_seen_before=None,
    revoked: bool | None = None,
) -> QuerySet[Device]:
    """device_list narrowed by the REST list's filters (each optional; all must hold).

    ``filter_text`` is Ferry's filter language over the live devices (PolicyError if malformed);
    ``group_id`` an unknown group is NotFound.
    """
    devices = device_list(organisation=organisation)
    if filter_text:
        devices = devices.filter(
            pk__in=devices_matching(organisation_id=organisation.pk, filter_text=filter_text)
        )
    if group_id is not None:
        group = device_group_get(organisation=organisation, group_id=group_id)
        devices = devices.filter(pk__in=device_group_member_ids(group=group))
    if version_id is not None:
        devices = devices.filter(running_version_id=version_id)
    if last_seen_after is not None:
        devices = devices.filter(last_seen_at__gte=last_seen_after)
    if last_seen_before is not None:
        devices = devices.filter(last_seen_at__lt=last_seen_before)
    if revoked is not None:
        devices = devices.filter(revoked_at__isnull=not revoked)
    return devices


def device_history(*, device: Device, limit: int = 50) -> list[DeviceVersionChange]:
    """The device's latest version changes, newest first."""
    changes = device.version_changes.select_related("from_version__model", "to_version__model")
    return list(changes.order_by("-at", "-id")[:limit])


def enrolment_token_list(*, organisation: Organisation) -> QuerySet[EnrolmentToken]:
    return EnrolmentToken.objects.filter(organisation=organisation)


def enrolment_token_get(*, organisation: Organisation, token_id) -> EnrolmentToken:
    try:
        return enrolment_token_list(organisation=organisation).get(pk=token_id)
    except (EnrolmentToken.DoesNotExist, ValueError):
        raise NotFound(f"No enrolment token {token_id} in this organisation.") from None
