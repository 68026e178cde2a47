"""Celery doors onto release services: the periodic health-gate evaluation."""

from __future__ import annotations

from celery import shared_task

from releases.services import release_gates_evaluate_all


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def evaluate_release_gates() -> int:
    """Idempotent: each transition names the phase and revision it saw, so overlapping runs do no harm."""
    return len(release_gates_evaluate_all())
