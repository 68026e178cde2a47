"""Writes for models, versions and their conversion jobs."""

from __future__ import annotations

import logging
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from accounts.models import Organisation
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from ferry_cloud.api_errors import Conflict
from ferry_cloud.release_key import release_private_key

from converter import convert
from converter.errors import ConversionError
from deploy.signing import sign_package
from registry import storage
from registry.errors import InvalidUpload, VersionImmutable
from registry.models import Artifact, ConversionJob, Model, ModelVersion

log = logging.getLogger(__name__)

QUANTIZE_CHOICES = (None, "fp16", "int8", "int4")


def model_create(*, organisation: Organisation, name: str, description: str = "") -> Model:
    try:
        with transaction.atomic():
            return Model.objects.create(organisation=organisation, name=name, description=description)
    except IntegrityError:
        raise Conflict(f"A model named {name!r} already exists.") from None


def artifact_store(*, organisation: Organisation, kind: str, stream: BinaryIO, suffix: str) -> Artifact:
    digest, size = storage.sha256_of(stream)
    name = storage.save_content_addressed(f"{organisation.slug}/{kind}", digest, suffix, stream)
    artifact, _ = Artifact.objects.get_or_create(
        organisation=organisation, kind=kind, sha256=digest, defaults={"file": name, "size": size}
    )
    return artifact


def version_upload(
    *, model: Model, label: str, stream: BinaryIO, size: int, options: dict[str, Any] | None = None
) -> ModelVersion:
    """Store an uploaded ONNX file as a new version and queue its conversion."""
    options = options or {}
    if options.get("quantize") not in QUANTIZE_CHOICES:
        raise InvalidUpload(
            f"quantize must be one of fp16, int8, int4 or absent, not {options['quantize']!r}"
        )
    if size == 0:
        raise InvalidUpload("The uploaded file is empty.")
    if size > settings.FERRY_MAX_UPLOAD_BYTES:
        raise InvalidUpload(f"The file is {size} bytes; the limit is {settings.FERRY_MAX_UPLOAD_BYTES}.")
    if ModelVersion.objects.filter(model=model, label=label).exists():
        raise Conflict(f"{model.name} already has a version labelled {label!r}.")
    source = artifact_store(
        organisation=model.organisation, kind=Artifact.Kind.ONNX, stream=stream, suffix=".onnx"
    )
    try:
        with transaction.atomic():
            version = ModelVersion.objects.create(model=model, label=label, source=source, options=options)
            job = ConversionJob.objects.create(version=version)
            transaction.on_commit(lambda: _enqueue_conversion(job.pk))
    except IntegrityError:
        raise Conflict(f"{model.name} already has a version labelled {label!r}.") from None
    return version


def _enqueue_conversion(job_id: int) -> None:
    """Hand the job to a worker; if the broker is down the job stays queued, not lost.

    Workers re-enqueue stale jobs when they start (conversion_requeue_stale), so a
    broker outage or a worker killed mid-job only delays the conversion.
    """
    from registry.tasks import convert_version

    try:
        convert_version.delay(job_id)
    except Exception as exc:  # kombu raises many types; any of them means "not sent"
        log.error("could not enqueue conversion job %s: %s", job_id, exc)
        _job_log(job_id, f"queued, but the broker is unreachable ({exc}); a worker will pick it up on start")


def conversion_requeue_stale(*, older_than: timedelta = timedelta(minutes=2)) -> list[int]:
    """Re-enqueue jobs queued or running with no progress for a while (lost message, dead worker).

    Running a job twice is harmless: conversion is deterministic and packages are
    stored by digest.
    """
    cutoff = timezone.now() - older_than
    stale = list(
        ConversionJob.objects.filter(
            status__in=[ConversionJob.Status.QUEUED, ConversionJob.Status.RUNNING], updated_at__lt=cutoff
        ).values_list("pk", flat=True)
    )
    for job_id in stale:
        _job_log(job_id, "re-enqueued: no progress since " + cutoff.isoformat())
        _enqueue_conversion(job_id)
    return stale


def version_mark_released(*, version: ModelVersion) -> None:
    ModelVersion.objects.filter(pk=version.pk).update(released=True)


def version_update_options(*, version: ModelVersion, options: dict[str, Any]) -> None:
    if version.released:
        raise VersionImmutable(f"Version {version} has been released and can no longer change.")
    ModelVersion.objects.filter(pk=version.pk).update(options=options)


# --- the conversion job -----------------------------------------------------------------


def _job_log(job_id: int, message: str, progress: float | None = None) -> None:
    """Append a log line (and progress) in its own short transaction, so the API shows it live."""
    with transaction.atomic():
        job = ConversionJob.objects.select_for_update().get(pk=job_id)
        job.log = [*job.log, {"at": timezone.now().isoformat(), "message": message}]
        if progress is not None:
            job.progress = max(0.0, min(1.0, progress))
        job.save(update_fields=["log", "progress", "updated_at"])


def conversion_claim(*, job_id: int) -> bool:
    """Mark the job running; False when there is nothing to do (already succeeded or failed for good)."""
    with transaction.atomic():
        job = ConversionJob.objects.select_for_update().get(pk=job_id)
        if job.status in (ConversionJob.Status.SUCCEEDED, ConversionJob.Status.FAILED):
            return False
        job.status = ConversionJob.Status.RUNNING
        job.attempts += 1
        job.save(update_fields=["status", "attempts", "updated_at"])
    _job_log(job_id, f"attempt {job.attempts} started", 0.0)
    return True


def conversion_run(*, job_id: int) -> ConversionJob:
    """Convert, sign and store the version's package; safe to run again after a crash.

    The converter and the signature are deterministic and packages are stored by
    digest, so a re-run produces and records the very same bytes.
    """
    if not conversion_claim(job_id=job_id):
        return ConversionJob.objects.get(pk=job_id)
    job = ConversionJob.objects.select_related("version__model__organisation", "version__source").get(
        pk=job_id
    )
    version = job.version
    try:
        with (
            storage.local_copy(version.source.file.name, ".onnx") as src,
            tempfile.TemporaryDirectory() as tmp,
        ):
            unsigned, signed = Path(tmp) / "unsigned.ferry", Path(tmp) / "signed.ferry"
            report = convert(
                src,
                unsigned,
                quantize=version.options.get("quantize"),
                block_size=int(version.options.get("block_size", 32)),
                progress=lambda fraction, message: _job_log(job_id, message, 0.9 * fraction),
            )
            sign_package(unsigned, signed, release_private_key())
            _job_log(job_id, "package signed with the release key", 0.95)
            with open(signed, "rb") as stream:
                package = artifact_store(
                    organisation=version.model.organisation,
                    kind=Artifact.Kind.PACKAGE,
                    stream=stream,
                    suffix=".ferry",
                )
    except ConversionError as exc:
        return _conversion_fail(job_id, str(exc))
    with transaction.atomic():
        ModelVersion.objects.filter(pk=version.pk).update(
            package=package, report=report.to_dict(), status=ModelVersion.Status.READY
        )
        ConversionJob.objects.filter(pk=job_id).update(
            status=ConversionJob.Status.SUCCEEDED, progress=1.0, error="", updated_at=timezone.now()
        )
    _job_log(job_id, f"package {package.sha256[:12]} stored ({package.size} bytes)", 1.0)
    return ConversionJob.objects.get(pk=job_id)


def _conversion_fail(job_id: int, reason: str) -> ConversionJob:
    log.info("conversion job %s failed: %s", job_id, reason)
    with transaction.atomic():
        job = ConversionJob.objects.select_for_update().select_related("version").get(pk=job_id)
        job.status, job.error = ConversionJob.Status.FAILED, reason
        job.log = [*job.log, {"at": timezone.now().isoformat(), "message": f"failed: {reason}"}]
        job.save(update_fields=["status", "error", "log", "updated_at"])
        ModelVersion.objects.filter(pk=job.version_id).update(status=ModelVersion.Status.FAILED)
    return job
