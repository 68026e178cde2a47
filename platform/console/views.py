"""Console pages: thin doors onto the same selectors and services as the REST API."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from accounts.models import Membership
from accounts.selectors import membership_for_user, role_require
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from ferry_cloud.errors import DomainError, NotFound
from fleet.selectors import (
    device_count,
    device_get,
    device_group_get,
    device_group_list,
    device_group_member_ids,
    devices_per_version,
    devices_recently_seen,
)
from fleet.services import device_group_create, device_group_update, device_pin
from registry.models import ModelVersion
from registry.selectors import model_list, version_get
from releases.preview import release_target_preview
from releases.selectors import (
    release_device_counts,
    release_device_statuses,
    release_get,
    release_list,
    release_phases,
)
from releases.services import release_create, release_gate_evaluate, release_transition
from telemetry.selectors import fleet_rates

from console.forms import GroupForm, ReleaseForm, TargetPreviewForm, window_from

Role = Membership.Role
DASHBOARD_DEVICES = 20


def role_required(**roles: str) -> Callable:
    """The one place a page says who may use it: the role each method needs (get=..., post=...).

    Anonymous people are sent to the login page; a member below the role gets a 403 page saying
    which role it needs; a method not named is 405 (HEAD follows GET). The membership stays on
    the request for the view (its organisation) and the templates (which buttons to show).
    tests/console/test_console_roles.py reads ``required_roles`` off every console URL's view.
    """
    required = {method.upper(): role for method, role in roles.items()}
    if "GET" in required:
        required.setdefault("HEAD", required["GET"])

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def guarded(request, *args, **kwargs):
            role = required.get(request.method)
            if role is None:
                return HttpResponseNotAllowed(sorted(required))
            try:
                request.membership = membership_for_user(user=request.user)
                role_require(membership=request.membership, role=role)
            except DomainError as exc:
                return _error_page(request, exc)
            return view(request, *args, **kwargs)

        guarded = login_required(guarded)
        guarded.required_roles = required
        return guarded

    return decorate


def _organisation(request):
    return request.membership.organisation


def _can(request) -> dict[str, bool]:
    """What the templates may offer this member: viewers get no action buttons at all."""
    membership = request.membership
    return {
        "operate": membership.has_role(Role.RELEASE_MANAGER),
        "administer": membership.has_role(Role.ADMIN),
    }


def _error_page(request, exc: DomainError):
    """The console's mapping of a refusal that leaves nothing to show (the others become
    messages on the page the person came from): 404 for what is not found, 403 otherwise."""
    status = 404 if isinstance(exc, NotFound) else 403
    return render(request, "console/error.html", {"message": str(exc)}, status=status)


@role_required(get=Role.VIEWER)
def dashboard(request):
    org = _organisation(request)
    context = {
        "organisation": org,
        "can": _can(request),
        "versions": _ready_versions(org),
        "models": model_list(organisation=org),
        "releases": release_list(organisation=org),
        # a glance, not the fleet: the list with filters and pages is the Devices page
        "devices": devices_recently_seen(organisation=org, limit=DASHBOARD_DEVICES),
        "device_count": device_count(organisation=org),
        "spread": devices_per_version(organisation=org),
        "rates": fleet_rates(organisation=org),
    }
    return render(request, "console/dashboard.html", context)


@role_required(post=Role.RELEASE_MANAGER)
def release_action(request, release_id: str, action: str):
    back = redirect("console:dashboard")
    try:
        release = release_get(organisation=_organisation(request), release_id=release_id)
    except DomainError as exc:  # nothing by that id here (another tenant's included): 404
        return _error_page(request, exc)
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


@role_required(get=Role.VIEWER)
def release_detail(request, release_id: str):
    org = _organisation(request)
    try:
        release = release_get(organisation=org, release_id=release_id)
    except DomainError as exc:
        return _error_page(request, exc)
    phases = release_phases(release)
    context = {
        "organisation": org,
        "can": _can(request),
        "release": release,
        "phases": [
            {
                "number": i + 1,
                "current": i == release.current_phase,
                "done": i < release.current_phase,
                **p.as_dict(),
            }
            for i, p in enumerate(phases)
        ],
        "counts": release_device_counts(release=release),
        "device_statuses": release_device_statuses(release=release)[:500],
        "events": release.events.select_related("actor"),
        "gate": release.gate_status,
        "actions": _actions_for(release.state, release.download_only),
    }
    return render(request, "console/release_detail.html", context)


def _actions_for(state: str, download_only: bool) -> list[str]:
    actions = {
        "draft": ["start", "abort"],
        "active": ["pause", "advance", "abort", "rollback"],
        "paused": ["resume", "advance", "abort", "rollback"],
        "completed": ["rollback"],
    }.get(state, [])
    if download_only and state not in ("aborted", "rolled_back"):
        actions.append("activate")
    return actions


@role_required(post=Role.RELEASE_MANAGER)
def release_gate(request, release_id: str):
    try:
        release = release_get(organisation=_organisation(request), release_id=release_id)
    except DomainError as exc:
        return _error_page(request, exc)
    try:
        status = release_gate_evaluate(release_id=release.pk)
        messages.success(request, f"Gate evaluated: {status['step']} ({status['reason']}).")
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("console:dashboard")
    return redirect("console:release", release_id=release_id)


@role_required(get=Role.RELEASE_MANAGER, post=Role.RELEASE_MANAGER)
def release_new(request):
    """The New release form; static/console/release_preview.js shows, while one types, how many
    devices the target matches and whether the version fits them (release_preview below)."""
    org = _organisation(request)
    groups = device_group_list(organisation=org)
    form = ReleaseForm(request.POST or None, versions=_ready_versions(org), groups=groups)
    if request.method == "POST" and form.is_valid():
        try:
            arguments = form.service_arguments()
            release = release_create(
                organisation=org,
                version=version_get(organisation=org, version_id=form.cleaned_data["version"]),
                actor=request.user,
                **arguments,
            )
            messages.success(request, f"Release {release.name} created.")
            return redirect(reverse("console:release", kwargs={"release_id": release.pk}))
        except DomainError as exc:
            form.add_error(None, str(exc))
    return render(request, "console/release_new.html", {"organisation": org, "form": form})


@role_required(get=Role.RELEASE_MANAGER)
def release_preview(request):
    """JSON for the New release form: {"matching": n, "compatibility": {...}} or {"error": ...}."""
    org = _organisation(request)
    form = TargetPreviewForm(
        request.GET, versions=_ready_versions(org), groups=device_group_list(organisation=org)
    )
    if not form.is_valid():
        errors = "; ".join(f"{field}: {' '.join(e)}" for field, e in form.errors.items())
        return JsonResponse({"error": errors}, status=400)
    version = form.cleaned_data["version"]
    try:
        preview = release_target_preview(organisation=org, target=form.target(), version=version)
    except DomainError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(preview.as_dict(version))


@role_required(get=Role.VIEWER, post=Role.RELEASE_MANAGER)
def groups(request):
    org = _organisation(request)
    form = GroupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        window = window_from(data)
        try:
            device_group_create(
                organisation=org,
                name=data["name"],
                kind=data["kind"],
                filter_text=data["filter"],
                device_ids=[line.strip() for line in data["device_ids"].splitlines() if line.strip()],
                window=window,
            )
            messages.success(request, f"Group {data['name']} created.")
            return redirect("console:groups")
        except DomainError as exc:
            form.add_error(None, str(exc))
    rows = [
        {"group": g, "members": len(device_group_member_ids(group=g))}
        for g in device_group_list(organisation=org)
    ]
    context = {
        "organisation": org,
        "can": _can(request),
        "form": form,
        "rows": rows,
        "versions": _ready_versions(org),
    }
    return render(request, "console/groups.html", context)


def _ready_versions(org):
    return ModelVersion.objects.filter(
        model__organisation=org, status=ModelVersion.Status.READY, package__isnull=False
    ).select_related("model")


@role_required(post=Role.RELEASE_MANAGER)
def group_pin(request, group_id: str):
    """Pin a group's devices to a version (empty: unpin)."""
    try:
        group = device_group_get(organisation=_organisation(request), group_id=group_id)
    except DomainError as exc:
        return _error_page(request, exc)
    try:
        device_group_update(group=group, pinned_version_id=request.POST.get("version") or None)
        messages.success(request, f"Group {group.name}: pin saved.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("console:groups")


@role_required(post=Role.RELEASE_MANAGER)
def device_pin_view(request, device_id: str):
    """Pin one device to a version (empty: unpin)."""
    try:
        device = device_get(organisation=_organisation(request), device_id=device_id)
    except DomainError as exc:
        return _error_page(request, exc)
    try:
        device_pin(device=device, version_id=request.POST.get("version") or None)
        messages.success(request, f"Device {device.name}: pin saved.")
    except DomainError as exc:
        messages.error(request, str(exc))
    if request.POST.get("next") == "device":
        return redirect("console:device", device_id=device.pk)
    return redirect("console:dashboard")
