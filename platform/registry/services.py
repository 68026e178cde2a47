"""Writes for models, versions and their conversion jobs."""

from __future__ import annotations

import dataclasses
import logging
import re
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from accounts.models import Organisation
from django.conf import settings
from django.core.files.storage import default_storage
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError, Q
from django.utils import timezone
from ferry_cloud.errors import Conflict
from ferry_cloud.release_key import release_private_key

from converter import convert
from converter.errors import ConversionError
from converter.options import OPTION_NAMES, ConversionOptions, InvalidOptionsError
from deploy.package import ANY_DEVICE_CLASS, SignedClaims, sign_package
from deploy.package.digest import bytes_sha256
from deploy.package.reader import read_head
from registry import adapters, archives, checkpoints, storage
from registry.errors import InvalidUpload, VersionImmutable, VersionInUse
from registry.models import Artifact, ConversionJob, Model, ModelVersion
from registry.onnx_checks import check_self_contained

log = logging.getLogger(__name__)

MAX_CALIBRATION_BYTES = 64 * 1024 * 1024


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
    *,
    model: Model,
    label: str,
    stream: BinaryIO,
    size: int,
    options: dict[str, Any] | None = None,
    kind: str = ModelVersion.Kind.ONNX,
    base: ModelVersion | None = None,
) -> ModelVersion:
    """Store an upload as a new version and queue its conversion: an ONNX file, or for kind llm
    or diffusion a tar or zip of the checkpoint directory (checked member by member first), or
    for kind llm_adapter a tar or zip of a PEFT adapter directory trained on ``base``."""
    options = options or {}
    if kind == ModelVersion.Kind.ONNX:
        _check_conversion_options(options)
    else:
        options = checkpoints.check_options(kind, options)
    llm_digest = ""
    if kind == ModelVersion.Kind.LLM_ADAPTER:
        base = adapters.check_base(base, model.organisation_id)
        llm_digest = llm_digest_of(base)
    elif base is not None:
        raise InvalidUpload("base is for kind llm_adapter.", fields={"base": ["only for llm_adapter"]})
    if size == 0:
        raise InvalidUpload("The uploaded file is empty.")
    if size > settings.FERRY_MAX_UPLOAD_BYTES:
        raise InvalidUpload(f"The file is {size} bytes; the limit is {settings.FERRY_MAX_UPLOAD_BYTES}.")
    if ModelVersion.objects.filter(model=model, label=label).exists():
        raise Conflict(f"{model.name} already has a version labelled {label!r}.")
    # checked before anything is stored
    if kind == ModelVersion.Kind.ONNX:
        check_self_contained(stream)
        artifact_kind, suffix = Artifact.Kind.ONNX, ".onnx"
    else:
        suffix = archives.archive_suffix(stream)
        archives.check_archive(stream)
        artifact_kind = Artifact.Kind.ARCHIVE
    source = artifact_store(organisation=model.organisation, kind=artifact_kind, stream=stream, suffix=suffix)
    try:
        with transaction.atomic():
            version = ModelVersion.objects.create(
                model=model,
                label=label,
                kind=kind,
                source=source,
                options=options,
                base=base,
                llm_digest=llm_digest,
            )
            job = ConversionJob.objects.create(version=version)
            transaction.on_commit(lambda: _enqueue_conversion(job.pk))
    except IntegrityError:
        raise Conflict(f"{model.name} already has a version labelled {label!r}.") from None
    return version


def _check_conversion_options(options: dict[str, Any]) -> ConversionOptions:
    """The per-version converter options, checked by the converter's one options object; the
    stored calibration reference stands in for the samples (only whether there are some counts)."""
    try:
        return ConversionOptions.from_dict({k: v for k, v in options.items() if k in OPTION_NAMES})
    except InvalidOptionsError as exc:
        raise InvalidUpload(str(exc), fields={exc.option: [str(exc)]}) from None


def calibration_store(*, organisation: Organisation, stream: BinaryIO, size: int) -> dict[str, Any]:
    """Store a calibration set (.npz of input arrays) by digest; return the version option that names it.

    Its contents are checked against the model's inputs by the converter, where the model is known.
    """
    if size == 0:
        raise InvalidUpload("The calibration file is empty.")
    if size > MAX_CALIBRATION_BYTES:
        raise InvalidUpload(f"The calibration file is {size} bytes; the limit is {MAX_CALIBRATION_BYTES}.")
    if stream.read(4) != b"PK\x03\x04":
        raise InvalidUpload("The calibration file must be an .npz (numpy.savez) archive of input arrays.")
    stream.seek(0)
    digest, size = storage.sha256_of(stream)
    name = storage.save_content_addressed(f"{organisation.slug}/calibration", digest, ".npz", stream)
    return {"file": name, "sha256": digest, "size": size}


def _converter_options(options: dict[str, Any], calibration: Path | None) -> ConversionOptions:
    """A version's stored options as convert()'s options, with the calibration samples' local copy."""
    return dataclasses.replace(_check_conversion_options(options), calibration=calibration)


# A broker that refuses one send is often back a moment later (the embedded SQLite broker
# while other processes create its tables, a Redis failover): a few quick retries first.
ENQUEUE_RETRY_DELAYS = (0.1, 0.5)


# The job queue port: how a conversion job reaches a worker is the Celery door's business
# (registry.tasks.send_conversion, registered by RegistryConfig.ready); the services only say when.
_job_queue: dict[str, Callable[[int], None]] = {}


def conversion_queue_register(*, send: Callable[[int], None]) -> None:
    """Say how to send a conversion job (by id) to a worker; ``send`` raises when it was not sent."""
    _job_queue["conversion"] = send


def _send_conversion(job_id: int) -> None:
    send = _job_queue.get("conversion")
    if send is None:
        raise RuntimeError("no job queue registered for conversions (is the registry app installed?)")
    send(job_id)


def _enqueue_conversion(job_id: int) -> None:
    """Hand the job to a worker; if the broker is down the job stays queued, not lost.

    Workers re-enqueue stale jobs when they start, and celery beat does every
    FERRY_REQUEUE_INTERVAL_SECONDS (conversion_requeue_stale), so a broker outage or a worker
    killed mid-job only delays the conversion.
    """
    for delay in (*ENQUEUE_RETRY_DELAYS, None):
        try:
            _send_conversion(job_id)
            return
        except Exception as exc:  # kombu raises many types; any of them means "not sent"
            if delay is not None:
                time.sleep(delay)
                continue
            log.error("could not enqueue conversion job %s: %s", job_id, exc)
            _job_log(job_id, f"queued, but the broker is unreachable ({exc}); a worker will pick it up later")


# A running job's worker touches the row every HEARTBEAT_SECONDS; after RUNNING_STALE_AFTER with no
# touch its worker is taken for dead. A queued job is re-sent after QUEUED_STALE_AFTER (its message
# may be lost); re-sending is cheap because a second message for a claimed job does nothing.
HEARTBEAT_SECONDS = 5.0
RUNNING_STALE_AFTER = timedelta(seconds=20)
QUEUED_STALE_AFTER = timedelta(minutes=2)


def conversion_requeue_stale(
    *,
    queued_after: timedelta = QUEUED_STALE_AFTER,
    running_after: timedelta = RUNNING_STALE_AFTER,
    restarted_worker: str = "",
) -> list[int]:
    """Re-enqueue jobs whose message or worker was lost; the job rows are the truth, not the broker.

    A running job whose heartbeat stopped, or that was claimed by an earlier incarnation of
    ``restarted_worker`` (a worker node that just started: whatever it ran before is dead),
    goes back to queued. Running a job twice is harmless: conversion is deterministic and
    packages are stored by digest.
    """
    now = timezone.now()
    orphaned = ConversionJob.objects.filter(status=ConversionJob.Status.RUNNING).filter(
        Q(updated_at__lt=now - running_after)
        | (Q(claimed_by__startswith=f"{restarted_worker}/") if restarted_worker else Q(pk__in=[]))
    )
    stale_queued = ConversionJob.objects.filter(
        status=ConversionJob.Status.QUEUED, updated_at__lt=now - queued_after
    )
    requeued = []
    for job_id in orphaned.values_list("pk", flat=True):
        if _release_orphan(job_id, running_after, restarted_worker):
            requeued.append(job_id)
    for job_id in stale_queued.values_list("pk", flat=True):
        _job_log(job_id, "re-enqueued: still queued since " + (now - queued_after).isoformat())
        requeued.append(job_id)
    for job_id in requeued:
        _enqueue_conversion(job_id)
    return requeued


def _release_orphan(job_id: int, running_after: timedelta, restarted_worker: str) -> bool:
    """Put a running job whose worker is gone back to queued (re-checked under the row lock)."""
    with transaction.atomic():
        job = ConversionJob.objects.select_for_update().get(pk=job_id)
        silent = job.updated_at < timezone.now() - running_after
        restarted = bool(restarted_worker) and job.claimed_by.startswith(f"{restarted_worker}/")
        if job.status != ConversionJob.Status.RUNNING or not (silent or restarted):
            return False
        why = (
            "its worker restarted" if restarted else f"no heartbeat for {running_after.total_seconds():.0f} s"
        )
        job.status, job.claimed_by = ConversionJob.Status.QUEUED, ""
        job.log = [*job.log, {"at": timezone.now().isoformat(), "message": f"re-enqueued: {why}"}]
        job.save(update_fields=["status", "claimed_by", "log", "updated_at"])
    return True


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


def conversion_claim(*, job_id: int, worker: str = "") -> bool:
    """Mark the job running for ``worker``; False when there is nothing to do: already succeeded or
    failed for good, or running on another worker whose heartbeat is fresh (a duplicate message)."""
    with transaction.atomic():
        job = ConversionJob.objects.select_for_update().get(pk=job_id)
        if job.status in (ConversionJob.Status.SUCCEEDED, ConversionJob.Status.FAILED):
            return False
        if job.status == ConversionJob.Status.RUNNING and not _claim_abandoned(job):
            return False
        job.status, job.claimed_by = ConversionJob.Status.RUNNING, worker
        job.attempts += 1
        job.save(update_fields=["status", "claimed_by", "attempts", "updated_at"])
    _job_log(job_id, f"attempt {job.attempts} started" + (f" on {worker}" if worker else ""), 0.0)
    return True


def _claim_abandoned(job: ConversionJob) -> bool:
    """A running job nobody is running: its heartbeat stopped, or no worker was named
    (a run outside Celery that died)."""
    return not job.claimed_by or job.updated_at < timezone.now() - RUNNING_STALE_AFTER


@contextmanager
def _heartbeat(job_id: int, worker: str) -> Iterator[None]:
    """Touch the running job's row every HEARTBEAT_SECONDS while the block runs, so sweepers can
    tell a long conversion from a dead worker."""
    done = threading.Event()

    def beat() -> None:
        try:
            while not done.wait(HEARTBEAT_SECONDS):
                ConversionJob.objects.filter(
                    pk=job_id, status=ConversionJob.Status.RUNNING, claimed_by=worker
                ).update(updated_at=timezone.now())
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=beat, name=f"heartbeat-job-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def conversion_run(*, job_id: int, worker: str = "") -> ConversionJob:
    """Convert, sign and store the version's package; safe to run again after a crash.

    The converter and the signature are deterministic and packages are stored by
    digest, so a re-run produces and records the very same bytes. ``worker`` names the
    process running it ("<worker node>/<pid>"), so a restarted worker can tell its orphans.
    """
    if not conversion_claim(job_id=job_id, worker=worker):
        return ConversionJob.objects.get(pk=job_id)
    job = ConversionJob.objects.select_related(
        "version__model__organisation", "version__source", "version__base__package"
    ).get(pk=job_id)
    version = job.version
    calibration = version.options.get("calibration")
    onnx = version.kind == ModelVersion.Kind.ONNX
    base = version.base.package.file.name if version.kind == ModelVersion.Kind.LLM_ADAPTER else None
    try:
        with (
            _heartbeat(job_id, worker),
            storage.local_copy(version.source.file.name, ".onnx" if onnx else ".archive") as src,
            storage.local_copy(calibration["file"], ".npz") if calibration else nullcontext() as samples,
            storage.local_copy(base, ".ferry") if base else nullcontext() as base_package,
            tempfile.TemporaryDirectory() as tmp,
        ):
            unsigned, signed = Path(tmp) / "unsigned.ferry", Path(tmp) / "signed.ferry"

            def progress(fraction: float, message: str) -> None:
                _job_log(job_id, message, 0.9 * fraction)

            if onnx:
                converted = convert(
                    src, unsigned, options=_converter_options(version.options, samples), progress=progress
                ).to_dict()
                summary = _accuracy_line(converted)
            elif base_package is not None:
                result = adapters.convert_adapter(
                    src, Path(tmp), base_package, unsigned, version.model.name, progress
                )
                converted, summary = result.report, result.summary
            else:
                workdir = Path(tmp) / "checkpoint"
                workdir.mkdir()
                result = checkpoints.convert_archive(
                    version.kind, src, workdir, unsigned, version.options, progress
                )
                converted, summary = result.report, result.summary
            _job_log(job_id, summary, 0.9)
            # the image role: signed once, for a device class and this organisation; which device
            # runs it when is a signed assignment (releases.assignments), never a re-signature
            claims = SignedClaims(
                device_class=str(version.options.get("device_class") or ANY_DEVICE_CLASS),
                organisation=str(version.model.organisation_id),
            )
            sign_package(unsigned, signed, release_private_key(), claims)
            # the weights an llm version's adapters bind to, an adapter's base's: for the release check
            digest = _llm_digest(version, unsigned, converted)
            _job_log(job_id, f"package signed with the release key for {claims.device_class}", 0.95)
            with open(signed, "rb") as stream:
                package = artifact_store(
                    organisation=version.model.organisation,
                    kind=Artifact.Kind.PACKAGE,
                    stream=stream,
                    suffix=".ferry",
                )
    except (ConversionError, InvalidUpload) as exc:
        # The converter names the files it read; here they are the worker's temporary copies.
        return _conversion_fail(job_id, _without_server_paths(str(exc), version.label))
    with transaction.atomic():
        ModelVersion.objects.filter(pk=version.pk).update(
            package=package, report=converted, status=ModelVersion.Status.READY, llm_digest=digest
        )
        ConversionJob.objects.filter(pk=job_id).update(
            status=ConversionJob.Status.SUCCEEDED, progress=1.0, error="", updated_at=timezone.now()
        )
    _job_log(job_id, f"package {package.sha256[:12]} stored ({package.size} bytes)", 1.0)
    return ConversionJob.objects.get(pk=job_id)


def _llm_digest(version: ModelVersion, unsigned: Path, report: dict[str, Any]) -> str:
    if version.kind == ModelVersion.Kind.LLM:
        return adapters.package_llm_digest(unsigned)
    if version.kind == ModelVersion.Kind.LLM_ADAPTER:
        return str(report["base_digest"])
    return ""


def llm_digest_of(version: ModelVersion) -> str:
    """The base weights an llm or llm_adapter version runs on; an llm version converted before
    the field existed has it read from its package once, and stored."""
    if version.llm_digest or version.kind != ModelVersion.Kind.LLM or version.package_id is None:
        return version.llm_digest
    with storage.local_copy(version.package.file.name, ".ferry") as package:
        digest = adapters.package_llm_digest(package)
    ModelVersion.objects.filter(pk=version.pk).update(llm_digest=digest)
    version.llm_digest = digest
    return digest


def _without_server_paths(message: str, label: str) -> str:
    """The error with the worker's temporary file paths replaced by what the user uploaded."""
    temp = re.escape(tempfile.gettempdir().rstrip("/"))
    message = re.sub(temp + r"/[^\s:'\"]+\.onnx", f"the uploaded model ({label})", message)
    message = re.sub(temp + r"/[^\s:'\"]+\.npz", "the calibration file", message)
    return re.sub(temp + r"/[^\s:'\"]+", "a temporary file", message)


def _accuracy_line(report: dict[str, Any]) -> str:
    """One log line summing up the accuracy report (the full one is stored on the version)."""
    accuracy = report.get("accuracy")
    if not accuracy:
        return f"converted ({report.get('quantize') or 'float32'}): {report['nodes_after']} nodes"
    parts = []
    for name, figures in accuracy["outputs"].items():
        top1 = figures.get("top1_agreement")
        parts.append(
            f"{name}: cosine {figures['cosine_similarity']:.5f}, max abs error {figures['max_abs_error']:.3g}"
            + (f", top-1 agreement {top1:.1%}" if top1 is not None else "")
        )
    size = f"size {report['size_ratio']:.1%} of float32" if report.get("size_ratio") else ""
    return f"accuracy vs float32 on {accuracy['samples']} {accuracy['inputs']} input(s): " + "; ".join(
        [*parts, size] if size else parts
    )


def _conversion_fail(job_id: int, reason: str) -> ConversionJob:
    log.info("conversion job %s failed: %s", job_id, reason)
    with transaction.atomic():
        job = ConversionJob.objects.select_for_update().select_related("version").get(pk=job_id)
        job.status, job.error = ConversionJob.Status.FAILED, reason
        job.log = [*job.log, {"at": timezone.now().isoformat(), "message": f"failed: {reason}"}]
        job.save(update_fields=["status", "error", "log", "updated_at"])
        ModelVersion.objects.filter(pk=job.version_id).update(status=ModelVersion.Status.FAILED)
    return job


# --- what an assignment names -------------------------------------------------------------


def package_manifest_sha256(*, artifact: Artifact) -> str:
    """The sha256 of the package's manifest.json, what its signature covers and what a signed
    assignment names (deploy.trust.assignment); reads only the archive's first member."""
    with storage.open_at(artifact.file.name, 0) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        manifest, _ = read_head(tar, unpacking=False)
    return bytes_sha256(manifest)


@transaction.atomic
def version_delete(*, version: ModelVersion) -> None:
    """Delete a version nothing ever used: never released, not converting, no release, device or
    group referring to it. Its stored files go once the deletion is committed, unless another
    artifact holds the same content (storage is content-addressed)."""
    if version.released:
        raise VersionInUse(f"Version {version.label} has been released; released versions are kept.")
    if version.status == ModelVersion.Status.CONVERTING:
        raise VersionInUse(f"Version {version.label} is converting; delete it once conversion ends.")
    artifacts = [a for a in (version.source, version.package) if a is not None]
    try:
        with transaction.atomic():
            version.delete()
    except ProtectedError:
        raise VersionInUse(
            f"Version {version.label} is referred to by a release, a device pin or a group pin; "
            "remove those first."
        ) from None
    names = []
    for artifact in artifacts:
        try:
            with transaction.atomic():
                artifact.delete()
            names.append(artifact.file.name)
        except ProtectedError:  # another version shares this artifact
            pass
    transaction.on_commit(lambda: _storage_forget(names))


def _storage_forget(names: list[str]) -> None:
    for name in names:
        if name and not Artifact.objects.filter(file=name).exists():
            default_storage.delete(name)
