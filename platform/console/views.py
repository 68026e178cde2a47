"""Console pages: thin doors onto the same selectors and services as the REST API."""

from __future__ import annotations

from accounts.selectors import organisation_for_user
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from ferry_cloud.errors import DomainError, NotFound
from fleet.selectors import (
    device_get,
    device_group_get,
    device_group_list,
    device_group_member_ids,
    device_list,
    devices_per_version,
)
from fleet.services import device_group_create, device_group_update, device_pin
from registry.models import ModelVersion
from registry.selectors import model_list, version_get
from releases.selectors import release_device_counts, release_get, release_list, release_phases
from releases.services import release_create, release_gate_evaluate, release_transition
from telemetry.selectors import fleet_rates

from console.forms import GroupForm, ReleaseForm, window_from


def _organisation(request):
    return organisation_for_user(user=request.user)


def _error_page(request, exc: DomainError):
    """The console's mapping of a refusal that leaves nothing to show (the others become
    messages on the page the person came from): 404 for what is not found, 403 otherwise."""
    status = 404 if isinstance(exc, NotFound) else 403
    return render(request, "console/error.html", {"message": str(exc)}, status=status)


@login_required
def dashboard(request):
    try:
        org = _organisation(request)
    except DomainError as exc:
        return _error_page(request, exc)
    context = {
        "organisation": org,
        "versions": _ready_versions(org),
        "models": model_list(organisation=org),
        "releases": release_list(organisation=org),
        "devices": device_list(organisation=org),
        "spread": devices_per_version(organisation=org),
        "rates": fleet_rates(organisation=org),
    }
    return render(request, "console/dashboard.html", context)


@login_required
@require_POST
def release_action(request, release_id: str, action: str):
    back = redirect("console:dashboard")
    try:
        org = _organisation(request)
        release = release_get(organisation=org, release_id=release_id)
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


@login_required
def release_detail(request, release_id: str):
    try:
        org = _organisation(request)
        release = release_get(organisation=org, release_id=release_id)
    except DomainError as exc:
        return _error_page(request, exc)
    phases = release_phases(release)
    context = {
        "organisation": org,
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


@login_required
@require_POST
def release_gate(request, release_id: str):
    try:
        release = release_get(organisation=_organisation(request), release_id=release_id)
        status = release_gate_evaluate(release_id=release.pk)
        messages.success(request, f"Gate evaluated: {status['step']} ({status['reason']}).")
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("console:dashboard")
    return redirect("console:release", release_id=release_id)


@login_required
def release_new(request):
    try:
        org = _organisation(request)
    except DomainError as exc:
        return _error_page(request, exc)
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


@login_required
def groups(request):
    try:
        org = _organisation(request)
    except DomainError as exc:
        return _error_page(request, exc)
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
    context = {"organisation": org, "form": form, "rows": rows, "versions": _ready_versions(org)}
    return render(request, "console/groups.html", context)


def _ready_versions(org):
    return ModelVersion.objects.filter(
        model__organisation=org, status=ModelVersion.Status.READY, package__isnull=False
    ).select_related("model")


@login_required
@require_POST
def group_pin(request, group_id: str):
    """Pin a group's devices to a version (empty: unpin)."""
    try:
        group = device_group_get(organisation=_organisation(request), group_id=group_id)
        device_group_update(group=group, pinned_version_id=request.POST.get("version") or None)
        messages.success(request, f"Group {group.name}: pin saved.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("console:groups")


@login_required
@require_POST
def device_pin_view(request, device_id: str):
    """Pin one device to a version (empty: unpin)."""
    try:
        device = device_get(organisation=_organisation(request), device_id=device_id)
        device_pin(device=device, version_id=request.POST.get("version") or None)
        messages.success(request, f"Device {device.name}: pin saved.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect("console:dashboard")
