"""Celery doors onto registry services: they take ids and hold no logic."""

import os

from celery import shared_task
from celery.signals import worker_ready

from registry.services import conversion_requeue_stale, conversion_run


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def convert_version(self, job_id: int) -> str:
    # "<node>/<pid>": the process, so a restarted node knows the jobs its predecessor held.
    return conversion_run(job_id=job_id, worker=f"{self.request.hostname}/{os.getpid()}").status


def send_conversion(job_id: int) -> None:
    """The registry's job queue port (RegistryConfig.ready registers it): one message per job.

    ``delay`` is looked up at each call, so a test that patches it is heard."""
    convert_version.delay(job_id)


@worker_ready.connect
def requeue_stale_jobs(sender=None, **_) -> None:
    """A worker that starts picks up jobs whose message was lost, whose worker stopped beating,
    and at once those its own node ran before it restarted (that process is gone)."""
    conversion_requeue_stale(restarted_worker=getattr(sender, "hostname", "") or "")


@shared_task
def requeue_stale_conversions() -> list[int]:
    """Run by celery beat: jobs whose message or worker was lost do not wait for a worker start."""
    return conversion_requeue_stale()
