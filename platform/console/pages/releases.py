"""One release: its page, the live part htmx re-fetches every 2 s, the canary charts and their
JSON, and the actions (pause, resume, advance, abort, roll back, activate, run the gate)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.cache import cache
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from ferry_cloud.errors import DomainError
from fleet.models import Device
from releases.models import DeviceReleaseStatus, Release
from releases.selectors import (
    release_device_counts,
    release_device_statuses_among,
    release_get,
    release_phases,
    release_selected_devices,
)
from releases.services import release_gate_evaluate, release_transition
from telemetry.series import CanarySeries, version_vs_fleet_hourly

from console.pages.charts import HEIGHT, WIDTH, comparison
from console.views import Role, error_page, organisation_of, permissions_of, role_required
from deploy.errors import PolicyError
from deploy.gates import GateThresholds

STATUS_PAGE = 50  # per-device rows shown at once: the page weighs the same at 100 or 100,000 devices
TIMELINE = 50  # latest events shown (device refusals are events too: they grow with the fleet)
CHART_HOURS = 24
# The current phase's selection reads every matching device (linear in the fleet); the 2 s poll
# keeps it this long per release revision. Reports are always read fresh: a device's change
# shows at the next poll; a device whose attributes change mid-phase, within this many seconds.
SELECTION_SECONDS = 15
STATUS_STATES = tuple(DeviceReleaseStatus.State.values)
DONE_STATES = ("installed", "running")
# (what, the figure in the gate's last evaluation, the threshold in GateThresholds)
GATE_CHECKS = (
    ("Activation failure rate", "activation_failure_rate", "max_activation_failure_rate"),
    ("Inference error rate", "error_rate", "max_error_rate"),
    ("p95 latency ratio (vs the previous version)", "latency_p95_ratio", "max_latency_p95_ratio"),
    ("Restarts per device", "restarts_per_device", "max_restarts_per_device"),
    ("Output drift", "drift", "max_drift"),
)
GATE_FACTS = (
    ("Devices reporting", "devices_reporting"),
    ("Devices pending", "devices_pending"),
    ("Devices refused or failed", "devices_refused"),
    ("Online devices still installing (the last phase waits for them)", "devices_unsettled"),
    ("Error rate of the rest of the fleet", "baseline_error_rate"),
    ("p95 latency (ms)", "latency_ms_p95"),
    ("p95 latency of the rest of the fleet (ms)", "baseline_latency_ms_p95"),
)
ACTIONS = {
    "draft": ["start", "abort"],
    "active": ["pause", "advance", "abort", "rollback"],
    "paused": ["resume", "advance", "abort", "rollback"],
    "completed": ["rollback"],
}
CONFIRM = {
    "start": "Start this release: devices begin to download it.",
    "pause": "Pause this release: no more devices are offered it.",
    "resume": "Resume this release.",
    "advance": "Advance to the next phase: more devices are offered it.",
    "abort": "Abort this release: devices that installed it go back to their previous version.",
    "rollback": "Roll back: every device that installed it goes back to its previous version.",
    "activate": "Activate: devices switch to the pre-staged version.",
}


def actions_for(state: str, download_only: bool) -> list[dict[str, str]]:
    names = list(ACTIONS.get(state, []))
    if download_only and state not in ("aborted", "rolled_back"):
        names.append("activate")
    return [{"name": n, "confirm": CONFIRM.get(n, f"{n.capitalize()} this release?")} for n in names]


def _status_query(params) -> tuple[str, int]:
    state = str(params.get("state", ""))
    state = state if state in STATUS_STATES else ""
    try:
        page = max(1, min(int(params.get("page", 1)), 100_000))
    except (TypeError, ValueError):
        page = 1
    return state, page


def gate_rows(release: Release) -> list[dict[str, Any]]:
    """The gate's checks with the last evaluation's value, the release's threshold and whether
    it is over; a malformed stored gate shows the defaults (the evaluation refuses it anyway)."""
    try:
        thresholds = GateThresholds.from_dict(release.gate)
    except PolicyError:
        thresholds = GateThresholds()
    figures = (release.gate_status or {}).get("figures") or {}
    rows = []
    for name, figure, limit_name in GATE_CHECKS:
        value, limit = figures.get(figure), getattr(thresholds, limit_name)
        over = value is not None and limit is not None and value > limit
        rows.append({"name": name, "value": value, "limit": limit, "over": over})
    return rows


def phase_rows(release: Release, progress: float) -> list[dict[str, Any]]:
    rows = []
    for i, phase in enumerate(release_phases(release)):
        current, done = i == release.current_phase, i < release.current_phase
        rows.append(
            {
                "number": i + 1,
                "current": current,
                "done": done,
                "progress": 100 if done or release.state == "completed" else (progress if current else 0),
                **phase.as_dict(),
            }
        )
    return rows


def _selected(release: Release) -> dict[str, tuple[str, Any]]:
    """The current phase's selected devices, kept SELECTION_SECONDS per release revision, phase,
    state and live fleet size (one indexed count catches enrolments, revocations, deletions)."""
    fleet = Device.objects.filter(organisation_id=release.organisation_id, revoked_at__isnull=True).count()
    key = f"console:selection:{release.pk}:{release.revision}:{release.current_phase}:{release.state}:{fleet}"
    selected = cache.get(key)
    if selected is None:
        selected = release_selected_devices(release=release)
        cache.set(key, selected, SELECTION_SECONDS)
    return selected


def live_context(request, release: Release) -> dict[str, Any]:
    """What the live part of the release page shows; the page and its 2 s poll share it."""
    state, page = _status_query(request.GET)
    statuses = release_device_statuses_among(release=release, selected=_selected(release))
    by_state: dict[str, int] = {}
    for row in statuses:
        by_state[row["state"]] = by_state.get(row["state"], 0) + 1
    done = sum(by_state.get(s, 0) for s in DONE_STATES)
    progress = round(100 * done / len(statuses)) if statuses else 0
    shown = [r for r in statuses if r["state"] == state] if state else statuses
    start = (page - 1) * STATUS_PAGE
    params = {"state": state} if state else {}
    more = len(shown) > start + STATUS_PAGE
    return {
        "organisation": organisation_of(request),
        "can": permissions_of(request),
        "release": release,
        "phases": phase_rows(release, progress),
        "progress": progress,
        "counts": release_device_counts(release=release),
        "by_state": sorted(by_state.items()),
        "statuses_total": len(statuses),
        "status_filter": state,
        "device_statuses": shown[start : start + STATUS_PAGE],
        "status_first": start + 1,
        "status_last": start + len(shown[start : start + STATUS_PAGE]),
        "status_shown": len(shown),
        "status_prev": "?" + urlencode({**params, "page": page - 1}) if page > 1 else "",
        "status_next": "?" + urlencode({**params, "page": page + 1}) if more else "",
        "status_query": urlencode({**params, "page": page}),
        "events": list(release.events.select_related("actor").order_by("-at", "-id")[:TIMELINE]),
        "gate": release.gate_status,
        "gate_rows": gate_rows(release),
        "gate_facts": [(n, (release.gate_status or {}).get("figures", {}).get(k)) for n, k in GATE_FACTS],
        "actions": actions_for(release.state, release.download_only),
        "live_at": timezone.now(),
    }


def _release_or_404(request, release_id: str) -> Release:
    return release_get(organisation=organisation_of(request), release_id=release_id)


@role_required(get=Role.VIEWER)
def release_detail(request, release_id: str):
    try:
        release = _release_or_404(request, release_id)
    except DomainError as exc:
        return error_page(request, exc)
    context = {
        **live_context(request, release),
        **chart_context(release),
        "states": STATUS_STATES,
    }
    return render(request, "console/release_detail.html", context)


@role_required(get=Role.VIEWER)
def release_live(request, release_id: str):
    """The release page's live part (state, phases, gate, per-device status, controls, timeline)."""
    try:
        release = _release_or_404(request, release_id)
    except DomainError as exc:
        return error_page(request, exc)
    return render(request, "console/live/release.html", live_context(request, release))


def canary_series(release: Release, hours: int = CHART_HOURS) -> CanarySeries:
    until = timezone.now()
    return version_vs_fleet_hourly(
        organisation_id=release.organisation_id,
        version_id=str(release.version_id),
        since=until - timedelta(hours=hours - 1),
        until=until,
    )


def chart_context(release: Release) -> dict[str, Any]:
    series = canary_series(release)
    error = comparison(
        "error rate",
        [h.error_rate for h in series.version],
        [h.error_rate for h in series.others],
    )
    latency = comparison(
        "p95 latency (ms)",
        [h.latency_ms_p95 for h in series.version],
        [h.latency_ms_p95 for h in series.others],
    )
    return {
        "canary_charts": [c for c in (error, latency) if c is not None],
        "canary_hours": len(series.hours),
        "chart_box": f"0 0 {WIDTH} {HEIGHT}",
        "chart_since": series.hours[0] if series.hours else None,
    }


@role_required(get=Role.VIEWER)
def release_canary_chart(request, release_id: str):
    """The canary comparison charts (SVG drawn here), re-fetched by the page every 10 s."""
    try:
        release = _release_or_404(request, release_id)
    except DomainError as exc:
        return error_page(request, exc)
    return render(request, "console/live/canary.html", {"release": release, **chart_context(release)})


@role_required(get=Role.VIEWER)
def release_canary(request, release_id: str):
    """JSON: hour by hour, the release's version against the rest of the fleet (from rollups)."""
    try:
        release = _release_or_404(request, release_id)
    except DomainError as exc:
        return JsonResponse({"error": str(exc)}, status=404)
    try:
        hours = max(1, min(int(request.GET.get("hours", CHART_HOURS)), 24 * 31))
    except ValueError:
        return JsonResponse({"error": "hours must be a whole number from 1 to 744."}, status=400)
    series = canary_series(release, hours)

    def cohort(figures) -> dict[str, list]:
        return {
            "devices": [h.devices for h in figures],
            "inferences": [h.inferences for h in figures],
            "errors": [h.errors for h in figures],
            "error_rate": [h.error_rate for h in figures],
            "latency_ms_p95": [h.latency_ms_p95 for h in figures],
        }

    return JsonResponse(
        {
            "release": str(release.pk),
            "version": str(release.version_id),
            "bucket_seconds": 3600,
            "hours": [h.isoformat() for h in series.hours],
            "release_devices": cohort(series.version),
            "rest_of_fleet": cohort(series.others),
            "sources": {"rollup_rows": series.rollup_rows, "raw_groups": series.raw_groups},
        }
    )


@role_required(post=Role.RELEASE_MANAGER)
def release_action(request, release_id: str, action: str):
    back = redirect("console:dashboard")
    try:
        release = _release_or_404(request, release_id)
    except DomainError as exc:  # nothing by that id here (another tenant's included): 404
        return error_page(request, exc)
    try:
        if request.POST.get("next") == "detail":
            back = redirect("console:release", release_id=release.pk)
        revision = request.POST.get("expected_revision")
        phase = request.POST.get("phase")
        release_transition(
            release_id=release.pk,
            action=action,
            actor=request.user,
            reason=request.POST.get("reason", ""),
            expected_revision=int(revision) if revision else None,
            phase=int(phase) if phase else None,
        )
        messages.success(request, f"Release {release.name}: {action} done.")
    except DomainError as exc:
        messages.error(request, str(exc))
    except ValueError:
        messages.error(request, "The form's revision or phase is not a number; reload the page.")
    return back


@role_required(post=Role.RELEASE_MANAGER)
def release_gate(request, release_id: str):
    try:
        release = _release_or_404(request, release_id)
    except DomainError as exc:
        return error_page(request, exc)
    try:
        status = release_gate_evaluate(release_id=release.pk)
        messages.success(request, f"Gate evaluated: {status['step']} ({status['reason']}).")
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("console:dashboard")
    return redirect("console:release", release_id=release_id)
