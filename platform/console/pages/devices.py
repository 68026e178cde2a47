"""The device list (filters, keyset pages, bulk actions with a confirmation) and one device."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from accounts.selectors import role_require
from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils import timezone
from ferry_cloud.errors import DomainError
from fleet.models import Device
from fleet.selectors import (
    DEVICE_STATES,
    LAST_SEEN_CHOICES,
    DeviceQuery,
    device_get,
    device_group_get,
    device_group_list,
    device_page,
    device_version_history,
    devices_by_ids,
)
from fleet.services import InvalidPin, device_group_update, device_pin, device_revoke
from releases.selectors import device_release_statuses
from telemetry.selectors import device_recent_records

from console.pages.charts import HEIGHT, WIDTH, line
from console.views import Role, error_page, organisation_of, permissions_of, ready_versions, role_required
from deploy.errors import PolicyError

PAGE_SIZE = 50
MAX_BULK = 500  # a bulk action names its devices one by one; more than this is a group's job
ONLINE_WITHIN = timedelta(minutes=5)
BULK_ACTIONS = {
    "pin": "Pin to a version",
    "unpin": "Unpin",
    "add-to-group": "Add to group",
    "revoke": "Revoke",
}
CHARTS = (("p95 latency (ms)", "latency_ms_p95"), ("inferences", "inferences"), ("errors", "errors"))
FILTER_PARAMS = ("filter", "group", "version", "state", "seen")
LAST_SEEN_NAMES = {
    "5m": "in the last 5 minutes",
    "1h": "in the last hour",
    "1d": "in the last day",
    "older": "more than a day ago",
    "never": "never",
}


def _query_from(params) -> DeviceQuery:
    def field(name: str, choices=None) -> str:
        value = str(params.get(name, "")).strip()[:4000]
        return value if choices is None or value in choices else ""

    return DeviceQuery(
        filter_text=field("filter"),
        group_id=field("group"),
        version_id=field("version"),
        state=field("state", DEVICE_STATES),
        last_seen=field("seen", LAST_SEEN_CHOICES),
    )


def device_state(device: Device, now=None) -> str:
    now = now or timezone.now()
    if device.revoked_at:
        return "revoked"
    if device.last_seen_at is None:
        return "never seen"
    return "online" if now - device.last_seen_at <= ONLINE_WITHIN else "offline"


@role_required(get=Role.VIEWER)
def devices_list(request):
    org = organisation_of(request)
    query = _query_from(request.GET)
    page, problem = None, ""
    try:
        page = device_page(
            organisation=org, query=query, cursor=request.GET.get("after", "")[:1000], size=PAGE_SIZE
        )
    except (DomainError, PolicyError) as exc:
        problem = str(exc)
    now = timezone.now()
    rows = [{"device": d, "state": device_state(d, now)} for d in (page.devices if page else [])]
    params = {k: v for k, v in request.GET.items() if k in FILTER_PARAMS and v}
    more = page.next_cursor if page else None
    context = {
        "organisation": org,
        "can": permissions_of(request),
        "query": query,
        "rows": rows,
        "page": page,
        "problem": problem,
        "first_url": "?" + urlencode(params),
        "next_url": "?" + urlencode({**params, "after": more}) if more else "",
        "paged": bool(request.GET.get("after")),
        "groups": device_group_list(organisation=org),
        "versions": ready_versions(org),
        "states": DEVICE_STATES,
        "last_seen": LAST_SEEN_NAMES,
        "actions": {
            k: v for k, v in BULK_ACTIONS.items() if k != "revoke" or permissions_of(request)["administer"]
        },
    }
    return render(request, "console/pages/devices.html", context)


@role_required(post=Role.RELEASE_MANAGER)
def devices_bulk(request):
    """A bulk action: the first POST shows what would happen, the second (confirmed) does it."""
    org = organisation_of(request)
    action = request.POST.get("action", "")
    if action not in BULK_ACTIONS:
        choices = ", ".join(BULK_ACTIONS)
        messages.error(request, f"Unknown bulk action {action[:40]!r}; choose one of {choices}.")
        return redirect("console:devices")
    if action == "revoke":
        try:  # revoking is an admin's, as in the REST API
            role_require(membership=request.membership, role=Role.ADMIN)
        except DomainError as exc:
            return error_page(request, exc)
    ids = request.POST.getlist("device")[: MAX_BULK + 1]
    if len(ids) > MAX_BULK:
        messages.error(request, f"At most {MAX_BULK} devices at once; use a device group for more.")
        return redirect("console:devices")
    devices = devices_by_ids(organisation=org, device_ids=ids)
    if not devices:
        messages.error(request, "No devices selected: tick the devices to act on first.")
        return redirect("console:devices")
    try:
        target = _bulk_target(org, action, request.POST)
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("console:devices")
    if request.POST.get("confirmed") != "yes":
        context = {
            "organisation": org,
            "action": action,
            "action_name": BULK_ACTIONS[action],
            "devices": devices,
            "target": target,
            "version_id": request.POST.get("version", ""),
            "group_id": request.POST.get("group", ""),
        }
        return render(request, "console/pages/devices_confirm.html", context)
    try:
        _bulk_do(action, devices, target)
        messages.success(request, f"{BULK_ACTIONS[action]}: done for {len(devices)} device(s).")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("console:devices")


def _bulk_target(org, action: str, data):
    """The version (pin) or group (add-to-group) the action needs; NotFound/Invalid otherwise."""
    if action == "pin":
        version = ready_versions(org).filter(pk=data.get("version") or None).first()
        if version is None:
            raise InvalidPin("Choose a converted version to pin the devices to.")
        return version
    if action == "add-to-group":
        return device_group_get(organisation=org, group_id=data.get("group", ""))
    return None


def _bulk_do(action: str, devices: list[Device], target) -> None:
    if action == "add-to-group":
        device_group_update(group=target, add_device_ids=[str(d.pk) for d in devices])
        return
    for device in devices:
        if action == "pin":
            device_pin(device=device, version_id=target.pk)
        elif action == "unpin":
            device_pin(device=device, version_id=None)
        elif action == "revoke":
            device_revoke(device=device)


def _live_context(request, device: Device) -> dict:
    return {
        "organisation": organisation_of(request),
        "can": permissions_of(request),
        "device": device,
        "state": device_state(device),
        "groups": device.groups.order_by("name"),
        "history": device_version_history(device=device),
        "release_statuses": device_release_statuses(device=device),
        "live_at": timezone.now(),
    }


@role_required(get=Role.VIEWER)
def device_detail(request, device_id: str):
    org = organisation_of(request)
    try:
        device = device_get(organisation=org, device_id=device_id)
    except DomainError as exc:
        return error_page(request, exc)
    telemetry = device_recent_records(device=device, limit=60)
    metrics = [r for r in reversed(telemetry) if r["kind"] == "metrics"]
    charts = [line(name, [r[key] for r in metrics]) for name, key in CHARTS]
    context = {
        **_live_context(request, device),
        "charts": [c for c in charts if c is not None],
        "telemetry": telemetry[:20],
        "versions": ready_versions(org),
        "chart_box": f"0 0 {WIDTH} {HEIGHT}",
        "chart_records": len(metrics),
    }
    return render(request, "console/pages/device.html", context)


@role_required(get=Role.VIEWER)
def device_live(request, device_id: str):
    """The device page's live part: state, running version, version history, release reports."""
    try:
        device = device_get(organisation=organisation_of(request), device_id=device_id)
    except DomainError as exc:
        return error_page(request, exc)
    return render(request, "console/live/device.html", _live_context(request, device))
