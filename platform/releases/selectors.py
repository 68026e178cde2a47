"""Reads for releases, and the bridge from rows to deploy/'s plain policies."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum
from ferry_cloud.errors import NotFound
from ferry_cloud.events import EVENT_TYPES
from fleet.models import Device, DeviceGroup, DeviceVersionChange
from fleet.selectors import fleet_version_counts
from registry.models import ModelVersion

from deploy.errors import PolicyError
from deploy.filters import Filter
from deploy.phases import ROLLING_BACK, Phase, phases_from
from deploy.rollout import (
    Decision,
    DeviceFacts,
    PolicySet,
    ReleasePolicy,
    Target,
    VersionRef,
    bucket,
    matches,
    selection_threshold,
)
from deploy.windows import MaintenanceWindow
from releases.models import DeviceReleaseStatus, Release, ReleaseEvent, ReleaseStateCount

TARGET_FIELDS = frozenset({"labels", "device_ids", "group_ids", "filter", "percentage"})
# releases that have a say over devices (drafts have none yet)
LIVE_STATES = ("active", "paused", "completed", "aborted", "rolled_back")


def release_phases(release: Release) -> tuple[Phase, ...]:
    return phases_from(release.phases, float((release.target or {}).get("percentage", 100.0)))


def target_from(data: dict[str, Any], groups: dict[str, DeviceGroup], percentage: float) -> Target:
    """deploy's Target for a release's target JSON; PolicyError names what is wrong."""
    if not isinstance(data, dict):
        raise PolicyError("a target must be an object")
    unknown = set(data) - TARGET_FIELDS
    if unknown:
        raise PolicyError(f"unknown target field(s): {', '.join(sorted(unknown))}")
    group_ids = frozenset(str(g) for g in data.get("group_ids", []))
    missing = group_ids - set(groups)
    if missing:
        raise PolicyError(f"no device group(s) {', '.join(sorted(missing))} in this organisation")
    dynamic = {
        gid: Filter.parse(groups[gid].filter)
        for gid in group_ids
        if groups[gid].kind == DeviceGroup.Kind.DYNAMIC
    }
    filter_text = data.get("filter") or ""
    return Target(
        device_ids=frozenset(str(d) for d in data.get("device_ids", [])),
        group_ids=group_ids,
        labels={str(k): str(v) for k, v in data.get("labels", {}).items()},
        percentage=percentage,
        filter=Filter.parse(filter_text) if filter_text else None,
        group_filters=dynamic,
    )


def organisation_groups(*, organisation_id) -> dict[str, DeviceGroup]:
    return {str(g.pk): g for g in DeviceGroup.objects.filter(organisation_id=organisation_id)}


def policy_from_release(release: Release, groups: dict[str, DeviceGroup] | None = None) -> ReleasePolicy:
    """deploy's view of a release row, with the current phase's percentage; PolicyError if malformed."""
    if groups is None:
        groups = organisation_groups(organisation_id=release.organisation_id)
    phases = release_phases(release)
    phase = phases[min(release.current_phase, len(phases) - 1)]
    target = target_from(release.target or {}, groups, float(phase.percentage))
    if release.bucket_threshold is not None and release.threshold_phase == release.current_phase:
        target = replace(target, threshold=release.bucket_threshold)  # computed for this phase only
    return ReleasePolicy(
        release_id=str(release.pk),
        organisation_id=str(release.organisation_id),
        version_id=str(release.version_id),
        package_digest=release.version.package.sha256 if release.version.package_id else "",
        salt=release.salt,
        target=target,
        priority=release.priority,
        created_at=release.created_at.timestamp() if release.created_at else 0.0,
        status=release.state,
        download_only=release.download_only,
        window=MaintenanceWindow.from_dict(release.window),
    )


def release_list(*, organisation: Organisation) -> QuerySet[Release]:
    return Release.objects.filter(organisation=organisation).select_related(
        "version__model", "version__package"
    )


def releases_by_version(*, version_ids: list) -> dict[str, list[Release]]:
    """{version id: the releases that shipped it, newest first} for many versions in one query."""
    shipped: dict[str, list[Release]] = {str(v): [] for v in version_ids}
    for release in Release.objects.filter(version_id__in=version_ids).order_by("-created_at"):
        shipped[str(release.version_id)].append(release)
    return shipped


def release_get(*, organisation: Organisation, release_id, with_events: bool = False) -> Release:
    """The release; ``with_events``: its events and their actors too, in two more queries
    whatever their number (the detail answer lists them)."""
    releases = release_list(organisation=organisation)
    if with_events:
        releases = releases.prefetch_related("events__actor")
    try:
        return releases.get(pk=release_id)
    except (Release.DoesNotExist, ValueError, ValidationError):
        raise NotFound(f"No release {release_id} in this organisation.") from None


def live_policies(*, organisation_id, groups: dict[str, DeviceGroup] | None = None) -> list[ReleasePolicy]:
    """Every release that has a say over devices: active, paused, completed and rolling back."""
    if groups is None:
        groups = organisation_groups(organisation_id=organisation_id)
    releases = Release.objects.filter(
        organisation_id=organisation_id, state__in=LIVE_STATES, version__package__isnull=False
    ).select_related("version__package")
    return [policy_from_release(r, groups) for r in releases]


def active_policies(*, organisation_id) -> list[ReleasePolicy]:
    return [p for p in live_policies(organisation_id=organisation_id) if p.status == Release.State.ACTIVE]


def _ref(version: ModelVersion | None) -> VersionRef | None:
    if version is None or version.package_id is None:
        return None
    return VersionRef(str(version.pk), version.package.sha256)


def device_facts(
    device: Device,
    groups: dict[str, DeviceGroup] | None = None,
    policies: list[ReleasePolicy] | None = None,
) -> DeviceFacts:
    """What deploy/ needs to know about a device: attributes, groups, pin, window and history."""
    attributes = {str(k): str(v) for k, v in (device.attributes or {}).items()}
    labels = {str(k): str(v) for k, v in (device.labels or {}).items()}
    if groups is None:
        groups = organisation_groups(organisation_id=device.organisation_id)
    static = frozenset(str(g) for g in device.groups.values_list("pk", flat=True)) if groups else frozenset()
    mine = sorted(
        (
            g
            for gid, g in groups.items()
            if gid in static
            or (g.kind == DeviceGroup.Kind.DYNAMIC and Filter.parse(g.filter)(attributes, labels))
        ),
        key=lambda g: g.name,  # a device in several pinned or windowed groups: the first by name decides
    )
    pin = _ref(device.pinned_version) if device.pinned_version_id else None
    if pin is None:
        pin = next((_ref(g.pinned_version) for g in mine if g.pinned_version_id), None)
    window = next((MaintenanceWindow.from_dict(g.window) for g in mine if g.window), None)
    previous: dict[str, VersionRef | None] = {}
    rolling_back = [p for p in policies or [] if p.status in ROLLING_BACK]
    if rolling_back:
        changes = DeviceVersionChange.objects.filter(
            device=device, to_version_id__in={p.version_id for p in rolling_back}
        ).select_related("from_version__package")
        first_change: dict[str, DeviceVersionChange] = {}
        for change in changes:  # ordered by time: keep the first arrival of each version
            first_change.setdefault(str(change.to_version_id), change)
        for policy in rolling_back:
            if policy.version_id in first_change:
                previous[policy.release_id] = _ref(first_change[policy.version_id].from_version)
    return DeviceFacts(
        reached_by=_reached_by(device, policies or []),
        device_id=str(device.pk),
        organisation_id=str(device.organisation_id),
        attributes=attributes,
        labels=labels,
        group_ids=static,
        running_version_id=str(device.running_version_id or ""),
        pin=pin,
        window=window,
        previous_versions=previous,
    )


def _reached_by(device: Device, policies: list[ReleasePolicy]) -> frozenset[str]:
    """The paused releases whose version this device began running since the release was
    created: they reached it, so they keep it (a pin lifted later brings it back to them)."""
    paused = [p for p in policies if p.status == Release.State.PAUSED]
    if not paused:
        return frozenset()
    arrivals = DeviceVersionChange.objects.filter(
        device=device, to_version_id__in={p.version_id for p in paused}
    ).values_list("to_version_id", "at")
    latest: dict[str, float] = {}
    for version_id, at in arrivals:
        latest[str(version_id)] = max(latest.get(str(version_id), 0.0), at.timestamp())
    return frozenset(p.release_id for p in paused if latest.get(p.version_id, -1.0) >= p.created_at)


@dataclass(frozen=True)
class DesiredPackage:
    """What the gateway offers a checking-in device.

    release is None for a pinned version. With rollback=True the device goes back to an
    older version: the very same package, in a new signed assignment (releases.assignments).
    """

    release: Release | None
    version: ModelVersion
    download_only: bool
    rollback: bool
    window: dict | None


def decision_for(device: Device) -> Decision | None:
    groups = organisation_groups(organisation_id=device.organisation_id)
    policies = live_policies(organisation_id=device.organisation_id, groups=groups)
    return PolicySet(policies).decide(device_facts(device, groups, policies))


def desired_package_for(device: Device) -> DesiredPackage | None:
    """What the device should run, or None to keep what it runs."""
    decision = decision_for(device)
    if decision is None:
        return None
    version = ModelVersion.objects.select_related("model", "package").get(pk=decision.version_id)
    release = None
    if decision.release_id:
        release = Release.objects.select_related("version__model", "version__package").get(
            pk=decision.release_id
        )
    return DesiredPackage(
        release=release,
        version=version,
        download_only=decision.download_only,
        rollback=decision.rollback,
        window=decision.window.as_dict() if decision.window else None,
    )


def desired_release_for(device: Device) -> Release | None:
    """The release whose version the device should run (None for pins, rollbacks or nothing).

    Kept for callers that only offer a release's own version; desired_package_for says more.
    """
    desired = desired_package_for(device)
    if desired is None or desired.rollback or desired.release is None:
        return None
    return desired.release


def fleet_version_spread(*, organisation_id) -> dict:
    """{running version id (or None): live devices running it} for the organisation: one small
    query (fleet.selectors.fleet_version_counts), shared by every release shown in one answer."""
    return fleet_version_counts(organisation_id=organisation_id)


def release_device_counts(*, release: Release, spread: dict | None = None) -> dict[str, int]:
    """How many of the organisation's devices run the release's version, and how many run another."""
    if spread is None:
        spread = fleet_version_spread(organisation_id=release.organisation_id)
    on_release = spread.get(release.version_id, 0)
    return {"on_release_version": on_release, "on_other_versions": sum(spread.values()) - on_release}


@dataclass(frozen=True)
class Selection:
    """Who a release's current phase selects: computed from the whole matching population."""

    matching: dict[str, float]  # {device id: bucket} of the live devices the target matches
    threshold: float | None  # deploy.rollout.selection_threshold for the current phase
    selected: frozenset[str]  # the matching devices at or below the threshold
    running: frozenset[str] = frozenset()  # the matching devices running the release's version

    @property
    def describe(self) -> dict[str, int]:
        return {"matching": len(self.matching), "selected": len(self.selected)}


def release_matching_devices(
    release: Release, groups: dict[str, DeviceGroup] | None = None
) -> dict[str, tuple[float, bool]]:
    """{device id: (bucket, runs the release's version)} of the organisation's live devices the
    release's target matches (the percentage aside). Two queries: the devices, and the static
    group memberships."""
    if groups is None:
        groups = organisation_groups(organisation_id=release.organisation_id)
    target = target_from(release.target or {}, groups, 100.0)
    memberships: dict[str, set[str]] = {}
    if target.group_ids:
        through = DeviceGroup.members.through.objects.filter(devicegroup_id__in=target.group_ids)
        for device_id, group_id in through.values_list("device_id", "devicegroup_id"):
            memberships.setdefault(str(device_id), set()).add(str(group_id))
    devices = Device.objects.filter(organisation_id=release.organisation_id, revoked_at__isnull=True)
    # attributes and labels are read (JSON decoded, a dict built per device) only when the
    # target looks at them: a release to the whole fleet or to groups starts in a fraction
    if target.labels or target.filter is not None or target.group_filters:
        rows = devices.values_list("pk", "running_version_id", "attributes", "labels")
    else:
        rows = ((pk, running, None, None) for pk, running in devices.values_list("pk", "running_version_id"))
    organisation, version, salt = str(release.organisation_id), release.version_id, release.salt
    found = {}
    for pk, running, attributes, labels in rows:
        facts = DeviceFacts(
            device_id=str(pk),
            organisation_id=organisation,
            attributes={str(k): str(v) for k, v in attributes.items()} if attributes else {},
            labels={str(k): str(v) for k, v in labels.items()} if labels else {},
            group_ids=frozenset(memberships.get(str(pk), ())),
        )
        if matches(target, facts):
            found[facts.device_id] = (bucket(salt, facts.device_id), running == version)
    return found


def release_selection(release: Release, groups: dict[str, DeviceGroup] | None = None) -> Selection:
    """The current phase's threshold and selected devices, from the matching population now.

    Devices the stored threshold selected that run the release's version stay selected.
    """
    found = release_matching_devices(release, groups)
    matching = {d: b for d, (b, _) in found.items()}
    previous = release.bucket_threshold
    reached = [b for b, running in found.values() if running and previous is not None and b <= previous]
    phases = release_phases(release)
    percentage = float(phases[min(release.current_phase, len(phases) - 1)].percentage)
    threshold = selection_threshold(percentage, matching.values(), keep=reached)
    target = Target(percentage=percentage, threshold=threshold)
    selected = frozenset(d for d, b in matching.items() if percentage > 0 and target.in_phase(b))
    running = frozenset(d for d, (_, on_version) in found.items() if on_version)
    return Selection(matching, threshold, selected, running)


def pinned_away(release: Release, device_ids: frozenset[str] | set[str]) -> frozenset[str]:
    """The devices among these whose pin (their own, else their first pinned group's by name, as
    device_facts resolves it) holds them on another version than the release's: the release does
    not assign them, so its gate must not count them. Three queries, whatever the count."""
    if not device_ids:
        return frozenset()
    version = str(release.version_id)
    groups = sorted(
        DeviceGroup.objects.filter(organisation_id=release.organisation_id, pinned_version__isnull=False),
        key=lambda g: g.name,
    )
    static: dict[str, set[str]] = {}
    if groups:
        through = DeviceGroup.members.through.objects.filter(
            devicegroup_id__in=[g.pk for g in groups], device_id__in=device_ids
        )
        for device_id, group_id in through.values_list("device_id", "devicegroup_id"):
            static.setdefault(str(device_id), set()).add(str(group_id))
    dynamic = {str(g.pk): Filter.parse(g.filter) for g in groups if g.kind == DeviceGroup.Kind.DYNAMIC}
    rows = Device.objects.filter(pk__in=device_ids).values_list(
        "pk", "pinned_version_id", "attributes", "labels"
    )
    away = set()
    for pk, own_pin, attributes, labels in rows:
        pin = own_pin
        if pin is None and groups:
            attributes = {str(k): str(v) for k, v in (attributes or {}).items()}
            labels = {str(k): str(v) for k, v in (labels or {}).items()}
            mine = static.get(str(pk), set())
            pin = next(
                (
                    g.pinned_version_id
                    for g in groups
                    if str(g.pk) in mine or (str(g.pk) in dynamic and dynamic[str(g.pk)](attributes, labels))
                ),
                None,
            )
        if pin is not None and str(pin) != version:
            away.add(str(pk))
    return frozenset(away)


def release_list_filtered(
    *, organisation: Organisation, states: list[str] | None = None, version_id=None
) -> QuerySet[Release]:
    """release_list narrowed by the REST list's filters: any of ``states``, one version."""
    releases = release_list(organisation=organisation)
    if states:
        releases = releases.filter(state__in=states)
    if version_id is not None:
        releases = releases.filter(version_id=version_id)
    return releases


def release_events(
    *,
    organisation: Organisation,
    release_id=None,
    actor: str | None = None,
    after=None,
    before=None,
    types: list[str] | None = None,
) -> QuerySet[ReleaseEvent]:
    """The organisation's audited events (its releases' and its bulk device actions'), narrowed
    by the optional filters: one release, one actor's username ("" for the system's own, the
    health gate), a time span, any of some event types (ferry_cloud.events.EVENT_TYPES)."""
    events = ReleaseEvent.objects.filter(organisation=organisation).select_related("actor", "release")
    if release_id is not None:
        events = events.filter(release_id=release_id)
    if actor == "":
        events = events.filter(actor__isnull=True)
    elif actor is not None:
        events = events.filter(actor__username=actor)
    if after is not None:
        events = events.filter(at__gte=after)
    if before is not None:
        events = events.filter(at__lt=before)
    if types:
        events = events.filter(_of_types(types))
    return events


def _of_types(types: list[str]) -> Q:
    wanted = Q(pk__in=[])
    for name in types:
        action, state = EVENT_TYPES[name]
        one = Q(action=action)
        if state is not None:
            one &= ~Q(to_state=state[1:]) if state.startswith("!") else Q(to_state=state)
        wanted |= one
    return wanted


# --- per-device status ------------------------------------------------------------------------

FAILED_DEVICE_STATES = ("refused", "failed", "rolled_back")


def release_device_failures(*, release: Release, device_ids: frozenset[str] | set[str]) -> dict[str, str]:
    """{device id: reason code} of these devices that refused, failed or rolled back the release."""
    if not device_ids:
        return {}
    rows = DeviceReleaseStatus.objects.filter(
        release=release, device_id__in=device_ids, state__in=FAILED_DEVICE_STATES
    ).values_list("device_id", "reason_code")
    return {str(device_id): code for device_id, code in rows}


# an answer to the release's offer: the device runs it, or said why it does not
SETTLED_DEVICE_STATES = ("running", *FAILED_DEVICE_STATES)


def release_unsettled_devices(
    *, release: Release, device_ids: frozenset[str] | set[str], online_since
) -> set[str]:
    """These devices that are online (seen since ``online_since``) and have not answered the
    release yet: no outcome reported (running, refused, failed, rolled back) and not running
    its version. An offline device is not waited for: it may never come back."""
    if not device_ids:
        return set()
    online = set(
        Device.objects.filter(pk__in=device_ids, last_seen_at__gte=online_since)
        .exclude(running_version_id=release.version_id)
        .values_list("pk", flat=True)
    )
    if not online:
        return set()
    settled = DeviceReleaseStatus.objects.filter(
        release=release, device_id__in=online, state__in=SETTLED_DEVICE_STATES
    ).values_list("device_id", flat=True)
    return {str(pk) for pk in online} - {str(pk) for pk in settled}


def release_device_statuses(*, release: Release, state: str | None = None) -> list[dict[str, Any]]:
    """Every device the release has a say over, with its reported status. A selected device
    without a report (an agent older than UpdateStatus, or none yet) is ``running`` if its
    check-ins say it runs the release's version, else ``pending``. Sorted: failures first,
    then by device name.

    ``state`` keeps only the devices in that state (the REST door checks it is one).
    """
    # plain values, not model rows: a release's reports are as many as its devices
    fields = (
        "device_name",
        "state",
        "reason_code",
        "message",
        "assignment_counter",
        "reported_at",
        "updated_at",
    )
    reports = DeviceReleaseStatus.objects.filter(release=release).values_list(
        "device_id", "device__name", *fields[1:]
    )
    rows = {str(device_id): dict(zip(fields, values, strict=True)) for device_id, *values in reports}
    selected: set[str] = set()
    if release.state in ("active", "paused", "completed"):
        selected = set(release_selection(release).selected)
    missing = selected - set(rows)
    unreported = Device.objects.filter(pk__in=missing).values_list("pk", "name", "running_version_id")
    result = [{"device_id": device_id, **row} for device_id, row in rows.items()]
    result += [
        {
            "device_id": str(pk),
            "device_name": name,
            "state": "running" if running == release.version_id else "pending",
            "reason_code": "",
            "message": "",
            "assignment_counter": 0,
            "reported_at": None,
            "updated_at": None,
        }
        for pk, name, running in (unreported if missing else ())
    ]
    if state:
        result = [r for r in result if r["state"] == state]
    order = {s: i for i, s in enumerate(FAILED_DEVICE_STATES)}
    result.sort(key=lambda r: (order.get(r["state"], len(order)), r["device_name"], r["device_id"]))
    return result


def release_state_counts(*, release_ids: list) -> dict[str, dict[str, int]]:
    """{release id: {reported state: devices}} for many releases in one query (stored reports
    only: a selected device that has not reported is not counted here). On PostgreSQL, read
    from the rows its triggers keep (releases.models.ReleaseStateCount), elsewhere counted."""
    counts: dict[str, dict[str, int]] = {str(r): {} for r in release_ids}
    if connection.vendor == "postgresql":
        rows = (
            ReleaseStateCount.objects.filter(release_id__in=release_ids)
            .values_list("release_id", "state")
            .annotate(n=Sum("devices"))
            .filter(n__gt=0)
        )
    else:
        rows = DeviceReleaseStatus.objects.filter(release_id__in=release_ids).values_list(
            "release_id", "state"
        )
        rows = rows.annotate(n=Count("id"))
    for release_id, state, n in rows.order_by():
        counts[str(release_id)][state] = n
    return counts


def recent_device_failures(*, organisation: Organisation, limit: int = 10) -> list[DeviceReleaseStatus]:
    """The organisation's latest refusals, failures and rollbacks reported by devices, newest
    first, with their device and release (one query)."""
    rows = DeviceReleaseStatus.objects.filter(
        release__organisation=organisation, state__in=FAILED_DEVICE_STATES
    ).select_related("device", "release")
    return list(rows.order_by("-updated_at", "-id")[:limit])


def device_release_statuses(*, device: Device, limit: int = 20) -> list[DeviceReleaseStatus]:
    """What one device last reported about each release that had a say over it, newest first:
    installs, refusals and rollbacks with their reasons (one query)."""
    rows = DeviceReleaseStatus.objects.filter(device=device).select_related("release")
    return list(rows.order_by("-updated_at", "-id")[:limit])


def release_selected_devices(*, release: Release) -> dict[str, tuple[str, Any]]:
    """{device id: (name, running version id)} of the devices the release's current phase
    selects (none for a draft, aborted or rolled back release): the selection plus one query."""
    if release.state not in ("active", "paused", "completed"):
        return {}
    selected = release_selection(release).selected
    rows = Device.objects.filter(pk__in=selected).values_list("pk", "name", "running_version_id")
    return {str(pk): (name, running) for pk, name, running in rows}


def release_device_statuses_among(
    *, release: Release, selected: dict[str, tuple[str, Any]]
) -> list[dict[str, Any]]:
    """release_device_statuses with the selection given (release_selected_devices): a caller
    that keeps it for a few seconds, such as the console's 2 s poll, saves its cost (it reads
    every matching device). The reports are read here, fresh; same rows, same order."""
    rows = {
        str(s.device_id): s
        for s in DeviceReleaseStatus.objects.filter(release=release).select_related("device")
    }
    result = [
        {
            "device_id": device_id,
            "device_name": row.device.name,
            "state": row.state,
            "reason_code": row.reason_code,
            "message": row.message,
            "reported_at": row.reported_at,
            "updated_at": row.updated_at,
        }
        for device_id, row in rows.items()
    ]
    result += [
        {
            "device_id": device_id,
            "device_name": name,
            "state": "running" if running == release.version_id else "pending",
            "reason_code": "",
            "message": "",
            "reported_at": None,
            "updated_at": None,
        }
        for device_id, (name, running) in selected.items()
        if device_id not in rows
    ]
    order = {s: i for i, s in enumerate(FAILED_DEVICE_STATES)}
    result.sort(key=lambda r: (order.get(r["state"], len(order)), r["device_name"], r["device_id"]))
    return result
