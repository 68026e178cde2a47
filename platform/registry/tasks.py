"""Celery doors onto registry services: they take ids and hold no logic."""

from celery import shared_task
from celery.signals import worker_ready

from registry.services import conversion_requeue_stale, conversion_run


@shared_task(acks_late=True, reject_on_worker_lost=True)
def convert_version(job_id: int) -> str:
    return conversion_run(job_id=job_id).status


@worker_ready.connect
def requeue_stale_jobs(**_) -> None:
    """A worker that starts picks up jobs whose message or worker was lost."""
    conversion_requeue_stale()


@shared_task
def requeue_stale_conversions() -> list[int]:
    """Run by celery beat: jobs whose message was never sent or was lost do not wait for the
    next worker start."""
    return conversion_requeue_stale()
