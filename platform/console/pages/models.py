"""Models list, one model's versions, one version's conversion report."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from ferry_cloud.errors import DomainError
from registry.models import ConversionJob, ModelVersion
from registry.selectors import model_get, model_search, model_versions, version_get
from registry.services import model_create, version_upload
from releases.selectors import releases_by_version

from console.forms import ModelForm, VersionUploadForm
from console.pages.reports import report_context, sizes
from console.views import Role, error_page, organisation_of, permissions_of, role_required

MODELS_PER_PAGE = 25
FINISHED_JOBS = (ConversionJob.Status.SUCCEEDED, ConversionJob.Status.FAILED)
STOP_POLLING = 286  # htmx stops an "every 2s" trigger when the answer has this status


@role_required(get=Role.VIEWER, post=Role.RELEASE_MANAGER)
def models_list(request):
    org = organisation_of(request)
    form = ModelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            model = model_create(organisation=org, **form.cleaned_data)
            messages.success(request, f"Model {model.name} created: upload its first version.")
            return redirect("console:model", model_id=model.pk)
        except DomainError as exc:
            form.add_error(None, str(exc))
    query = request.GET.get("q", "").replace("\x00", "").strip()[:200]  # PostgreSQL refuses NULs
    page = Paginator(model_search(organisation=org, query=query), MODELS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    context = {
        "organisation": org,
        "can": permissions_of(request),
        "query": query,
        "page": page,
        "form": form,
    }
    return render(request, "console/pages/models.html", context)


def _versions_context(request, model) -> dict[str, Any]:
    versions = list(model_versions(model=model).select_related("package", "job"))
    shipped = releases_by_version(version_ids=[v.pk for v in versions])
    rows = [{"version": v, "sizes": sizes(v), "releases": shipped[str(v.pk)]} for v in versions]
    converting = any(v.status == ModelVersion.Status.CONVERTING for v in versions)
    return {
        "organisation": organisation_of(request),
        "can": permissions_of(request),
        "model": model,
        "rows": rows,
        "converting": converting,
    }


@role_required(get=Role.VIEWER, post=Role.RELEASE_MANAGER)
def model_detail(request, model_id: int):
    """A model's versions; an operator uploads a new one here (it converts while one watches)."""
    org = organisation_of(request)
    try:
        model = model_get(organisation=org, model_id=model_id)
    except DomainError as exc:
        return error_page(request, exc)
    form = VersionUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            version = version_upload(
                model=model,
                label=form.cleaned_data["label"],
                stream=upload,
                size=upload.size,
                options=form.options(),
            )
            messages.success(request, f"{model.name} {version.label} uploaded: converting.")
            return redirect("console:version", version_id=version.pk)
        except DomainError as exc:
            form.add_error(None, str(exc))
    context = {**_versions_context(request, model), "form": form}
    return render(request, "console/pages/model.html", context)


@role_required(get=Role.VIEWER)
def model_live(request, model_id: int):
    """The model page's versions table while one converts; once none does, htmx stops asking."""
    try:
        model = model_get(organisation=organisation_of(request), model_id=model_id)
    except DomainError as exc:
        return error_page(request, exc)
    context = _versions_context(request, model)
    status = 200 if context["converting"] else STOP_POLLING
    return render(request, "console/live/model_versions.html", context, status=status)


@role_required(get=Role.VIEWER)
def version_job(request, version_id: str):
    """A version's conversion job (status, progress, log lines) while it converts; when it has
    finished, htmx is told to reload the page once, which then shows the report."""
    try:
        version = version_get(organisation=organisation_of(request), version_id=version_id)
    except DomainError as exc:
        return error_page(request, exc)
    job = getattr(version, "job", None)
    if (job is None or job.status in FINISHED_JOBS) and request.headers.get("HX-Request"):
        response = HttpResponse(status=STOP_POLLING)
        response["HX-Refresh"] = "true"
        return response
    return render(request, "console/live/version_job.html", {"version": version, "job": job})


@role_required(get=Role.VIEWER)
def version_detail(request, version_id: str):
    org = organisation_of(request)
    try:
        version = version_get(organisation=org, version_id=version_id)
    except DomainError as exc:
        return error_page(request, exc)
    report = version.report or {}
    context = {
        "organisation": org,
        "can": permissions_of(request),
        "version": version,
        "report": report,
        **report_context(version),
        "job": getattr(version, "job", None),
        "releases": releases_by_version(version_ids=[version.pk])[str(version.pk)],
        "releasable": version.status == ModelVersion.Status.READY and version.package_id is not None,
    }
    return render(request, "console/pages/version.html", context)
