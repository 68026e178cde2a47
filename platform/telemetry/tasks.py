"""Celery door onto telemetry retention: the periodic roll-up and prune (beat)."""

from __future__ import annotations

from celery import shared_task

from telemetry.retention import telemetry_roll_up_and_prune


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def roll_up_old_telemetry() -> int:
    """Idempotent: an hour is rolled up and deleted in one transaction; overlapping runs add nothing twice."""
    return telemetry_roll_up_and_prune().pruned
