"""Reads for the fleet."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.utils import timezone
from ferry_cloud.errors import NotFound

from deploy.filters import Filter
from fleet import filter_sql
from fleet.models import Device, DeviceGroup, DeviceVersionChange, DeviceVersionCount, EnrolmentToken


def device_list(*, organisation: Organisation) -> QuerySet[Device]:
    """The organisation's devices with their versions and, as ``telemetry_count``, how many
    telemetry records each has stored (counted in the same query).

    The count is a correlated subquery, not a join with GROUP BY: PostgreSQL then counts only
    the rows a page returns (it evaluates the subquery after ORDER BY ... LIMIT), where the
    grouped join counted every record of the whole fleet before taking a page."""
    stored = Device.objects.filter(pk=OuterRef("pk")).annotate(n=Count("telemetry")).values("n")
    return (
        Device.objects.filter(organisation=organisation)
        .select_related("running_version__model", "pinned_version__model")
        .annotate(telemetry_count=Subquery(stored))
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


def fleet_version_counts(*, organisation_id) -> dict:
    """{running version id (None: none): live devices running it} for the organisation.

    On PostgreSQL, read from the rows its triggers keep (fleet.models.DeviceVersionCount): a
    handful of rows however large the fleet, and as current as the devices themselves. Elsewhere
    the devices are counted (one scan of the organisation's live devices)."""
    if connection.vendor != "postgresql":
        rows = (
            Device.objects.filter(organisation_id=organisation_id, revoked_at__isnull=True)
            .values_list("running_version_id")
            .annotate(n=Count("id"))
            .order_by()
        )
    else:
        rows = (
            DeviceVersionCount.objects.filter(organisation_id=organisation_id)
            .values_list("version_id")
            .annotate(n=Sum("devices"))
            .filter(n__gt=0)
            .order_by()
        )
    return dict(rows)


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
        devices = _selected_by(devices, organisation, filter_text)
    if group_id is not None:
        group = device_group_get(organisation=organisation, group_id=group_id)
        if group.kind == DeviceGroup.Kind.STATIC:  # a join in the page's query, not a list of ids
            devices = devices.filter(groups=group)
        else:
            devices = _selected_by(devices, organisation, group.filter)
    if version_id is not None:
        devices = devices.filter(running_version_id=version_id)
    if last_seen_after is not None:
        devices = devices.filter(last_seen_at__gte=last_seen_after)
    if last_seen_before is not None:
        devices = devices.filter(last_seen_at__lt=last_seen_before)
    if revoked is not None:
        devices = devices.filter(revoked_at__isnull=not revoked)
    return devices


def _selected_by(devices: QuerySet[Device], organisation: Organisation, filter_text: str) -> QuerySet[Device]:
    """The live devices among ``devices`` the filter selects: a condition in the query itself
    when fleet.filter_sql translates it (the database stops at a full page), else the ids
    deploy/filters' own evaluation picks from every live device."""
    translated = filter_sql.condition(filter_text)
    if translated is None:
        return devices.filter(
            pk__in=devices_matching(organisation_id=organisation.pk, filter_text=filter_text)
        )
    return devices.filter(translated, revoked_at__isnull=True)


# --- the console's device list: filters and keyset pages over a large fleet ------------------

DEVICE_STATES = ("active", "revoked", "pinned")
LAST_SEEN = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "1d": timedelta(days=1)}
LAST_SEEN_CHOICES = (*LAST_SEEN, "older", "never")


@dataclass(frozen=True)
class DeviceQuery:
    """What the device list is narrowed to; empty fields narrow nothing."""

    filter_text: str = ""  # the deploy/filters language
    group_id: str = ""
    version_id: str = ""  # a version's id, or "none" for devices running none
    state: str = ""  # one of DEVICE_STATES
    last_seen: str = ""  # one of LAST_SEEN_CHOICES


@dataclass(frozen=True)
class DevicePage:
    devices: list[Device]
    next_cursor: str | None  # the cursor of the page after this one, None on the last
    matching: int | None  # devices the filter selects (only counted when a filter is given)


def _cursor_encode(device: Device) -> str:
    return base64.urlsafe_b64encode(json.dumps([device.name, str(device.pk)]).encode()).decode()


def _cursor_decode(cursor: str) -> tuple[str, str] | None:
    """The (name, id) a cursor stands for, or None for anything that is not one (start over)."""
    try:
        name, pk = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        name, pk = str(name), str(uuid.UUID(str(pk)))
    except (ValueError, TypeError):
        return None
    return None if "\x00" in name else (name, pk)  # no device name holds a NUL (PostgreSQL refuses one)


def _narrowed(organisation: Organisation, query: DeviceQuery, groups: dict) -> QuerySet[Device]:
    devices = Device.objects.filter(organisation=organisation)
    group = groups.get(query.group_id)
    if group is not None and group.kind == DeviceGroup.Kind.STATIC:
        devices = devices.filter(groups=group)
    if query.version_id == "none":
        devices = devices.filter(running_version__isnull=True)
    elif query.version_id:
        devices = devices.filter(running_version_id=query.version_id)
    if query.state == "active":
        devices = devices.filter(revoked_at__isnull=True)
    elif query.state == "revoked":
        devices = devices.filter(revoked_at__isnull=False)
    elif query.state == "pinned":
        devices = devices.filter(pinned_version__isnull=False)
    now = timezone.now()
    if query.last_seen in LAST_SEEN:
        devices = devices.filter(last_seen_at__gte=now - LAST_SEEN[query.last_seen])
    elif query.last_seen == "older":
        devices = devices.filter(last_seen_at__lt=now - LAST_SEEN["1d"])
    elif query.last_seen == "never":
        devices = devices.filter(last_seen_at__isnull=True)
    return devices


def device_page(
    *, organisation: Organisation, query: DeviceQuery, cursor: str = "", size: int = 50
) -> DevicePage:
    """One page of the organisation's devices by (name, id), after ``cursor``.

    Keyset pages: the database reads one page however deep into the fleet it is, and nothing
    counts the whole fleet. A filter in Ferry's language (or a dynamic group's) is evaluated
    here over the narrowed devices' facts, one pass that also gives the count of matches.
    Raises deploy.errors.PolicyError (FilterSyntaxError) for a malformed filter; an unknown
    group or version id is NotFound.
    """
    groups = {}
    if query.group_id:
        group = device_group_get(organisation=organisation, group_id=query.group_id)
        groups = {query.group_id: group}
    if query.version_id and query.version_id != "none":
        try:
            uuid.UUID(query.version_id)
        except ValueError:
            raise NotFound(f"No model version {query.version_id} in this organisation.") from None
    filters = [Filter.parse(query.filter_text)] if query.filter_text.strip() else []
    group = groups.get(query.group_id)
    if group is not None and group.kind == DeviceGroup.Kind.DYNAMIC:
        filters.append(Filter.parse(group.filter))
    devices = _narrowed(organisation, query, groups).order_by("name", "pk")
    after = _cursor_decode(cursor) if cursor else None
    following = devices
    if after:  # the keyset condition in the database's own order (its collation, not Python's)
        following = devices.filter(Q(name__gt=after[0]) | Q(name=after[0], pk__gt=after[1]))
    if not filters:
        return _page(list(_with_versions(following)[: size + 1]), size, matching=None)
    matching = sum(1 for facts in _facts(devices) if _selects(filters, facts))
    page_ids = []
    for facts in _facts(following):
        if _selects(filters, facts):
            page_ids.append(facts[0])
            if len(page_ids) > size:
                break
    found = {d.pk: d for d in _with_versions(Device.objects.filter(pk__in=page_ids))}
    return _page([found[pk] for pk in page_ids if pk in found], size, matching=matching)


def _facts(devices: QuerySet[Device]):
    return devices.values_list("pk", "attributes", "labels").iterator(chunk_size=5000)


def _selects(filters: list[Filter], facts: tuple) -> bool:
    _, attributes, labels = facts
    attributes = {str(k): str(v) for k, v in (attributes or {}).items()}
    labels = {str(k): str(v) for k, v in (labels or {}).items()}
    return all(f(attributes, labels) for f in filters)


def _with_versions(devices: QuerySet[Device]) -> QuerySet[Device]:
    return devices.select_related("running_version__model", "pinned_version__model")


def _page(rows: list[Device], size: int, matching: int | None) -> DevicePage:
    more = len(rows) > size
    rows = rows[:size]
    return DevicePage(devices=rows, next_cursor=_cursor_encode(rows[-1]) if more else None, matching=matching)


def devices_by_ids(*, organisation: Organisation, device_ids: list[str]) -> list[Device]:
    """The organisation's devices among ``device_ids`` (ids that are not its own, or not ids, left out)."""
    valid = []
    for value in device_ids:
        try:
            valid.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    return list(_with_versions(Device.objects.filter(organisation=organisation, pk__in=valid)))


def device_version_history(*, device: Device, limit: int = 50) -> list[DeviceVersionChange]:
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


def devices_recently_seen(*, organisation: Organisation, limit: int = 20) -> list[Device]:
    """The organisation's ``limit`` most recently seen devices (never seen ones last, by name)."""
    devices = _with_versions(Device.objects.filter(organisation=organisation))
    return list(devices.order_by(F("last_seen_at").desc(nulls_last=True), "name", "pk")[:limit])


def device_count(*, organisation: Organisation) -> int:
    return Device.objects.filter(organisation=organisation, revoked_at__isnull=True).count()


def device_state_counts(*, organisation: Organisation, online_within: timedelta) -> dict[str, int]:
    """{"online", "offline", "never_seen", "revoked": devices} of the organisation, in one query
    (the console's dashboard: the same cost at 100 devices as at 100,000)."""
    since = timezone.now() - online_within
    live = Q(revoked_at__isnull=True)
    return Device.objects.filter(organisation=organisation).aggregate(
        online=Count("id", filter=live & Q(last_seen_at__gte=since)),
        offline=Count("id", filter=live & Q(last_seen_at__lt=since)),
        never_seen=Count("id", filter=live & Q(last_seen_at__isnull=True)),
        revoked=Count("id", filter=Q(revoked_at__isnull=False)),
    )
