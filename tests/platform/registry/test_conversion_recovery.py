"""The job row decides who converts: a duplicate message does not run a job another worker is
running, a silent or restarted worker's job goes back to the queue, a running job beats."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from registry import services, tasks
from registry.models import ConversionJob, ModelVersion
from registry.services import conversion_requeue_stale, conversion_run

from tests.platform.conftest import onnx_bytes, upload


@pytest.fixture
def job(api) -> ConversionJob:
    model = api.post("/api/v1/models/", {"name": "m"}, format="json").json()
    return ModelVersion.objects.get(pk=upload(api, model["id"], "v1", onnx_bytes()).json()["id"]).job


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """What would have gone to the broker (the tests here are about the rows)."""
    messages: list[int] = []
    monkeypatch.setattr(tasks.convert_version, "delay", messages.append)
    return messages


def _running(job: ConversionJob, claimed_by: str, age: timedelta = timedelta(0)) -> None:
    ConversionJob.objects.filter(pk=job.pk).update(
        status=ConversionJob.Status.RUNNING,
        claimed_by=claimed_by,
        updated_at=timezone.now() - age,
        attempts=1,
    )


def test_a_duplicate_message_does_not_run_a_job_a_live_worker_holds(job):
    _running(job, "celery@a/100")
    result = conversion_run(job_id=job.pk, worker="celery@b/200")
    assert (result.status, result.attempts, result.claimed_by) == ("running", 1, "celery@a/100")


def test_a_job_whose_worker_stopped_beating_is_taken_over(job):
    _running(job, "celery@a/100", age=services.RUNNING_STALE_AFTER + timedelta(seconds=1))
    result = conversion_run(job_id=job.pk, worker="celery@b/200")
    assert (result.status, result.attempts, result.claimed_by) == ("succeeded", 2, "celery@b/200")


def test_the_sweeper_requeues_silent_jobs_and_leaves_beating_ones(api, job, sent):
    model = api.post("/api/v1/models/", {"name": "other"}, format="json").json()
    beating = ModelVersion.objects.get(pk=upload(api, model["id"], "v1", onnx_bytes()).json()["id"]).job
    _running(job, "celery@a/100", age=timedelta(minutes=1))
    _running(beating, "celery@a/101")
    sent.clear()
    assert conversion_requeue_stale() == [job.pk]
    assert sent == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.claimed_by) == ("queued", "")
    assert job.log[-1]["message"] == "re-enqueued: no heartbeat for 20 s"
    beating.refresh_from_db()
    assert beating.status == "running"


def test_a_restarted_node_requeues_what_it_ran_before_at_once(job, sent):
    _running(job, "celery@a/100")  # fresh heartbeat, but node celery@a has just started again
    assert conversion_requeue_stale(restarted_worker="celery@b") == []
    assert conversion_requeue_stale(restarted_worker="celery@a") == [job.pk]
    job.refresh_from_db()
    assert job.status == "queued" and job.log[-1]["message"] == "re-enqueued: its worker restarted"
    assert conversion_run(job_id=job.pk, worker="celery@a/300").status == "succeeded"


def test_a_running_job_beats_while_it_converts(transactional_db, job, monkeypatch):
    # transactional_db: the heartbeat writes from its own thread and connection
    monkeypatch.setattr(services, "HEARTBEAT_SECONDS", 0.05)
    _running(job, "celery@a/100", age=timedelta(minutes=5))
    before = ConversionJob.objects.get(pk=job.pk).updated_at
    with services._heartbeat(job.pk, "celery@a/100"):
        time.sleep(0.5)
    assert ConversionJob.objects.get(pk=job.pk).updated_at > before + timedelta(minutes=4)
