"""Console pages: thin doors onto the same selectors and services as the REST API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import lru_cache, wraps
from pathlib import Path

from accounts.models import Membership
from accounts.selectors import membership_for_user, role_require
from django.contrib import messages
from django.contrib.staticfiles import finders
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.views import SpectacularRedocView
from ferry_cloud.errors import DomainError, NotFound
from fleet.selectors import (
    device_count,
    device_get,
    device_group_get,
    device_group_list,
    device_group_member_ids,
    device_state_counts,
    devices_per_version,
    devices_recently_seen,
)
from fleet.services import device_group_create, device_group_update, device_pin
from registry.models import ConversionJob, ModelVersion
from registry.selectors import model_list, version_get
from releases.preview import release_target_preview
from releases.selectors import recent_device_failures, release_list, release_state_counts
from releases.services import release_create
from telemetry.selectors import fleet_rates

from console.forms import GroupForm, ReleaseForm, TargetPreviewForm, window_from
from console.session import login_required_or_401

Role = Membership.Role
DASHBOARD_DEVICES = 20
DASHBOARD_RELEASES = 20
DASHBOARD_FAILURES = 10
DASHBOARD_JOBS = 10
ONLINE_WITHIN = timedelta(minutes=5)


def role_required(**roles: str) -> Callable:
    """The one place a page says who may use it: the role each method needs (get=..., post=...).

    Anonymous people are sent to the login page (an htmx poll of a live part gets 401 and an
    HX-Redirect there instead: console/session.py); a member below the role gets a 403 page saying
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
                return error_page(request, exc)
            return view(request, *args, **kwargs)

        guarded = login_required_or_401(guarded)
        guarded.required_roles = required
        return guarded

    return decorate


def organisation_of(request):
    return request.membership.organisation


def permissions_of(request) -> dict[str, bool]:
    """What the templates may offer this member: viewers get no action buttons at all."""
    membership = request.membership
    return {
        "operate": membership.has_role(Role.RELEASE_MANAGER),
        "administer": membership.has_role(Role.ADMIN),
    }


def error_page(request, exc: DomainError):
    """The console's mapping of a refusal that leaves nothing to show (the others become
    messages on the page the person came from): 404 for what is not found, 403 otherwise."""
    status = 404 if isinstance(exc, NotFound) else 403
    return render(request, "console/error.html", {"message": str(exc)}, status=status)


def dashboard_live_context(request) -> dict:
    """The dashboard's changing part (fleet, releases with health, refusals, conversions); the
    page and its 2 s poll share it. A fixed number of queries whatever the fleet's size."""
    org = organisation_of(request)
    releases = list(release_list(organisation=org)[:DASHBOARD_RELEASES])
    states = release_state_counts(release_ids=[r.pk for r in releases])
    return {
        "organisation": org,
        "can": permissions_of(request),
        "releases": [{"release": r, "health": _health(r, states[str(r.pk)])} for r in releases],
        "device_count": device_count(organisation=org),
        "device_states": device_state_counts(organisation=org, online_within=ONLINE_WITHIN),
        "spread": devices_per_version(organisation=org),
        "rates": fleet_rates(organisation=org),
        "failures": recent_device_failures(organisation=org, limit=DASHBOARD_FAILURES),
        "jobs": ConversionJob.objects.filter(version__model__organisation=org)
        .select_related("version__model")
        .order_by("-created_at")[:DASHBOARD_JOBS],
        "live_at": timezone.now(),
    }


def _health(release, states: dict[str, int]) -> dict:
    """A release's health at a glance: the gate's last word and its devices' reports."""
    gate = release.gate_status or {}
    failed = sum(n for s, n in states.items() if s in ("refused", "failed", "rolled_back"))
    done = sum(n for s, n in states.items() if s in ("installed", "running"))
    verdict = "failing" if failed or gate.get("failures") else ("healthy" if done else "waiting")
    return {
        "verdict": verdict,
        "gate": gate.get("step", ""),
        "failed": failed,
        "done": done,
        "states": states,
    }


@role_required(get=Role.VIEWER)
def dashboard(request):
    org = organisation_of(request)
    context = {
        **dashboard_live_context(request),
        "versions": ready_versions(org),
        "models": model_list(organisation=org),
        # a glance, not the fleet: the list with filters and pages is the Devices page
        "devices": devices_recently_seen(organisation=org, limit=DASHBOARD_DEVICES),
    }
    return render(request, "console/dashboard.html", context)


@role_required(get=Role.VIEWER)
def dashboard_live(request):
    return render(request, "console/live/dashboard.html", dashboard_live_context(request))


# Redoc's sidebar shows Redocly's logo from their CDN, always (no option turns it off): the
# bundle is served with that one address swapped for an empty local image.
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"


@lru_cache(maxsize=1)
def _redoc_bundle() -> bytes:
    path = finders.find("drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js")
    if path is None:
        raise ImproperlyConfigured("drf-spectacular-sidecar is not installed: Redoc has no bundle.")
    return Path(path).read_bytes().replace(REDOCLY_LOGO.encode(), EMPTY_IMAGE.encode())


class RedocView(SpectacularRedocView):
    """Redoc from drf-spectacular-sidecar's vendored bundle, in a page without the CDN fonts
    and inline script of drf-spectacular's own template (so it works offline, under the CSP)."""

    template_name = "console/redoc.html"

    @staticmethod
    def _redoc_standalone() -> str:
        return reverse("console:redoc-bundle")


_redoc = RedocView.as_view(url_name="schema", title="Ferry control plane API")


@role_required(get=Role.VIEWER)
def redoc(request):
    return _redoc(request)


@role_required(get=Role.VIEWER)
def redoc_bundle(request):
    response = HttpResponse(_redoc_bundle(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "private, max-age=86400"
    return response


@role_required(get=Role.RELEASE_MANAGER, post=Role.RELEASE_MANAGER)
def release_new(request):
    """The New release form; static/console/release_preview.js shows, while one types, how many
    devices the target matches and whether the version fits them (release_preview below)."""
    org = organisation_of(request)
    groups = device_group_list(organisation=org)
    # "Release this version" links here with ?version=<id>: that version is chosen already
    initial = {"version": request.GET.get("version", "")[:64]}
    form = ReleaseForm(request.POST or None, versions=ready_versions(org), groups=groups, initial=initial)
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
    org = organisation_of(request)
    form = TargetPreviewForm(
        request.GET, versions=ready_versions(org), groups=device_group_list(organisation=org)
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
    org = organisation_of(request)
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
        "can": permissions_of(request),
        "form": form,
        "rows": rows,
        "versions": ready_versions(org),
    }
    return render(request, "console/groups.html", context)


def ready_versions(org):
    return ModelVersion.objects.filter(
        model__organisation=org, status=ModelVersion.Status.READY, package__isnull=False
    ).select_related("model")


@role_required(post=Role.RELEASE_MANAGER)
def group_pin(request, group_id: str):
    """Pin a group's devices to a version (empty: unpin)."""
    try:
        group = device_group_get(organisation=organisation_of(request), group_id=group_id)
    except DomainError as exc:
        return error_page(request, exc)
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
        device = device_get(organisation=organisation_of(request), device_id=device_id)
    except DomainError as exc:
        return error_page(request, exc)
    try:
        device_pin(device=device, version_id=request.POST.get("version") or None)
        messages.success(request, f"Device {device.name}: pin saved.")
    except DomainError as exc:
        messages.error(request, str(exc))
    if request.POST.get("next") == "device":
        return redirect("console:device", device_id=device.pk)
    return redirect("console:dashboard")
