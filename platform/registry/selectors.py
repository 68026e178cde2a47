"""Reads for models and versions, always scoped to an organisation."""

from __future__ import annotations

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db.models import Count, Max, Q, QuerySet
from ferry_cloud.errors import NotFound

from registry.models import ConversionJob, Model, ModelVersion


def model_list(*, organisation: Organisation) -> QuerySet[Model]:
    return Model.objects.filter(organisation=organisation).prefetch_related("versions")


def model_get(*, organisation: Organisation, model_id: int) -> Model:
    try:
        return Model.objects.get(organisation=organisation, pk=model_id)
    except (Model.DoesNotExist, ValueError):
        raise NotFound(f"No model {model_id} in this organisation.") from None


def version_get(*, organisation: Organisation, version_id) -> ModelVersion:
    try:
        return ModelVersion.objects.select_related("model", "package", "job").get(
            model__organisation=organisation, pk=version_id
        )
    except (ModelVersion.DoesNotExist, ValueError, ValidationError):
        raise NotFound(f"No model version {version_id} in this organisation.") from None


def version_list(
    *,
    organisation: Organisation,
    model_id: int | None = None,
    status: str | None = None,
    kind: str | None = None,
) -> QuerySet[ModelVersion]:
    """The organisation's versions (of one model, in one status, of one kind: each if given)."""
    versions = ModelVersion.objects.filter(model__organisation=organisation).select_related(
        "model", "package", "job"
    )
    if model_id is not None:
        versions = versions.filter(model_id=model_id)
    if status is not None:
        versions = versions.filter(status=status)
    if kind is not None:
        versions = versions.filter(kind=kind)
    return versions


def model_search(*, organisation: Organisation, query: str = "") -> QuerySet[Model]:
    """The organisation's models whose name or description holds ``query``, by name, each with
    ``version_count`` and ``latest_version_at``."""
    models = Model.objects.filter(organisation=organisation)
    if query:
        models = models.filter(Q(name__icontains=query) | Q(description__icontains=query))
    return models.annotate(
        version_count=Count("versions"), latest_version_at=Max("versions__created_at")
    ).order_by("name", "pk")


def model_versions(*, model: Model) -> QuerySet[ModelVersion]:
    """A model's versions, newest first, with what their rows show (package, job)."""
    return model.versions.select_related("package", "job").order_by("-created_at")


def conversion_job_list(
    *,
    organisation: Organisation,
    statuses: list[str] | None = None,
    model_id: int | None = None,
    version_id=None,
) -> QuerySet[ConversionJob]:
    """The organisation's conversion jobs (in these statuses, of one model or version: each if given)."""
    jobs = ConversionJob.objects.filter(version__model__organisation=organisation).select_related(
        "version__model"
    )
    if statuses:
        jobs = jobs.filter(status__in=statuses)
    if model_id is not None:
        jobs = jobs.filter(version__model_id=model_id)
    if version_id is not None:
        jobs = jobs.filter(version_id=version_id)
    return jobs


def conversion_job_get(*, organisation: Organisation, job_id: int) -> ConversionJob:
    try:
        return conversion_job_list(organisation=organisation).get(pk=job_id)
    except (ConversionJob.DoesNotExist, ValueError):
        raise NotFound(f"No conversion job {job_id} in this organisation.") from None
