"""Models, uploads and the conversion job, through the REST API and real storage (S3 server)."""

from __future__ import annotations

import json
import tempfile

from django.core.files.storage import default_storage
from registry.models import Artifact, ConversionJob, ModelVersion
from registry.services import conversion_run

from tests.platform.conftest import onnx_bytes, upload


def test_requests_without_credentials_are_refused(db):
    from rest_framework.test import APIClient

    response = APIClient().get("/api/v1/models/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_model_names_are_validated_and_unique(api):
    assert api.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    duplicate = api.post("/api/v1/models/", {"name": "m"}, format="json")
    assert duplicate.status_code == 409
    assert "already exists" in duplicate.json()["error"]["message"]
    bad = api.post("/api/v1/models/", {"name": "../etc"}, format="json")
    assert bad.status_code == 400
    assert "name" in bad.json()["error"]["fields"]


def test_upload_converts_signs_and_stores_the_package(api, ready_version):
    body = api.get(f"/api/v1/versions/{ready_version.pk}/").json()
    assert body["status"] == "ready"
    assert body["job"]["status"] == "succeeded" and body["job"]["progress"] == 1.0
    assert any("signed" in line["message"] for line in body["job"]["log"])
    assert body["report"]["package_size"] > 0
    package = ready_version.package
    assert default_storage.__class__.__name__ == "S3Storage"  # the services profile stores in S3
    assert default_storage.exists(package.file.name)
    with default_storage.open(package.file.name) as f:
        assert len(f.read()) == package.size == body["package_size"]


def test_rerunning_a_crashed_job_gives_the_same_package(api, ready_version):
    first = ready_version.package.sha256
    # a worker that died after claiming the job leaves it "running"; redelivery runs it again
    ConversionJob.objects.filter(pk=ready_version.job.pk).update(status=ConversionJob.Status.RUNNING)
    conversion_run(job_id=ready_version.job.pk)
    ready_version.refresh_from_db()
    assert ready_version.package.sha256 == first
    assert Artifact.objects.filter(kind=Artifact.Kind.PACKAGE).count() == 1
    assert ready_version.job.attempts == 2


def test_succeeded_job_is_not_run_twice(api, ready_version):
    conversion_run(job_id=ready_version.job.pk)
    ready_version.job.refresh_from_db()
    assert ready_version.job.attempts == 1


def test_malformed_onnx_fails_the_job_with_a_readable_error(api):
    model = api.post("/api/v1/models/", {"name": "broken"}, format="json").json()
    created = upload(api, model["id"], "v1", b"\x08\x07garbage that is not a model")
    assert created.status_code == 201
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    body = api.get(f"/api/v1/versions/{version.pk}/").json()
    assert body["status"] == "failed"
    assert body["job"]["status"] == "failed"
    assert body["job"]["error"]
    assert "Traceback" not in body["job"]["error"]
    # no server path: the worker's temporary copy is named as what the user uploaded
    assert body["job"]["error"].startswith("the uploaded model (v1): not an ONNX model"), body["job"]["error"]
    assert tempfile.gettempdir() not in json.dumps(body)
    assert Artifact.objects.filter(kind=Artifact.Kind.PACKAGE).count() == 0


def test_bad_uploads_are_refused(api):
    model = api.post("/api/v1/models/", {"name": "m"}, format="json").json()
    empty = upload(api, model["id"], "v1", b"")
    assert empty.status_code == 400
    bad_quantize = upload(api, model["id"], "v1", onnx_bytes(), quantize="int3")
    assert bad_quantize.status_code == 400
    assert "quantize" in bad_quantize.json()["error"]["fields"]
    assert upload(api, model["id"], "v1", onnx_bytes()).status_code == 201
    again = upload(api, model["id"], "v1", onnx_bytes())
    assert again.status_code == 409


def test_unknown_ids_are_404_not_500(api):
    assert api.get("/api/v1/versions/not-a-uuid/").status_code == 404
    assert api.get("/api/v1/versions/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert api.get("/api/v1/models/999999/").status_code == 404


def test_openapi_schema_lists_the_api(api):
    response = api.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/models/{model_id}/versions/" in paths
    assert "/api/v1/releases/{release_id}/{action}/" in paths


def test_a_send_the_broker_refuses_once_is_retried(api, monkeypatch, django_capture_on_commit_callbacks):
    """The broker refusing one send (seen with the embedded broker while other processes
    create its tables) costs a retry, not a job waiting for the next worker start."""
    from registry import services, tasks

    sent, real_delay = [], tasks.convert_version.delay

    def flaky_delay(job_id):
        sent.append(job_id)
        if len(sent) == 1:
            raise OSError("broker busy")
        return real_delay(job_id)

    monkeypatch.setattr(tasks.convert_version, "delay", flaky_delay)
    monkeypatch.setattr(services, "ENQUEUE_RETRY_DELAYS", (0.0, 0.0))
    model = api.post("/api/v1/models/", {"name": "m"}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):  # the job is sent once it is committed
        created = upload(api, model["id"], "v1", onnx_bytes())
    assert created.status_code == 201
    job = ModelVersion.objects.get(pk=created.json()["id"]).job
    assert sent == [job.pk, job.pk]
    assert job.status == ConversionJob.Status.QUEUED
    assert not any("unreachable" in line["message"] for line in job.log)


def test_celery_beat_re_enqueues_jobs_with_no_progress(api, monkeypatch, settings):
    from datetime import timedelta

    from django.utils import timezone
    from registry import tasks

    assert (
        settings.CELERY_BEAT_SCHEDULE["requeue-stale-conversions"]["task"]
        == tasks.requeue_stale_conversions.name
    )
    model = api.post("/api/v1/models/", {"name": "m"}, format="json").json()
    fresh = ModelVersion.objects.get(pk=upload(api, model["id"], "v1", onnx_bytes()).json()["id"]).job
    stale = ModelVersion.objects.get(pk=upload(api, model["id"], "v2", onnx_bytes()).json()["id"]).job
    ConversionJob.objects.filter(pk=stale.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    sent = []
    monkeypatch.setattr(tasks.convert_version, "delay", sent.append)
    assert tasks.requeue_stale_conversions() == [stale.pk]
    assert sent == [stale.pk] and fresh.pk not in sent
    stale.refresh_from_db()
    assert any("re-enqueued" in line["message"] for line in stale.log)
