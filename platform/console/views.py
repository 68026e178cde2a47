"""Console pages: thin doors onto the same selectors and services as the REST API."""

from __future__ import annotations

from accounts.selectors import organisation_for_user
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from ferry_cloud.api_errors import ServiceError
from fleet.selectors import device_list, devices_per_version
from registry.selectors import model_list
from releases.selectors import release_get, release_list
from releases.services import release_transition
from telemetry.selectors import fleet_rates


@login_required
def dashboard(request):
    try:
        org = organisation_for_user(user=request.user)
    except ServiceError as exc:
        return render(request, "console/error.html", {"message": str(exc)}, status=403)
    context = {
        "organisation": org,
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
    try:
        org = organisation_for_user(user=request.user)
        release = release_get(organisation=org, release_id=release_id)
        release_transition(
            release_id=release.pk, action=action, actor=request.user, reason=request.POST.get("reason", "")
        )
        messages.success(request, f"Release {release.name}: {action} done.")
    except ServiceError as exc:
        messages.error(request, str(exc))
    return redirect("console:dashboard")
