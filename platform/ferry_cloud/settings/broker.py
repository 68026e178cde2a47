"""Celery: Redis when REDIS_URL is set, otherwise an embedded SQLite broker."""

from __future__ import annotations

import os

from .base import DATA_DIR

# --- Celery: Redis when REDIS_URL is set, otherwise a SQLite broker that needs no server -----
CELERY_BROKER_URL = os.environ.get("REDIS_URL") or f"sqla+sqlite:///{DATA_DIR / 'celery-broker.sqlite3'}"
CELERY_TASK_ACKS_LATE = True  # a crashed worker's job is redelivered; tasks are idempotent
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True  # the database row is the job's source of truth
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# `celery beat` (one per deployment) evaluates the health gates of active releases.
CELERY_BEAT_SCHEDULE = {
    "evaluate-release-gates": {
        "task": "releases.tasks.evaluate_release_gates",
        "schedule": float(os.environ.get("FERRY_GATE_INTERVAL_SECONDS", "30")),
    },
    "requeue-stale-conversions": {
        "task": "registry.tasks.requeue_stale_conversions",
        "schedule": float(os.environ.get("FERRY_REQUEUE_INTERVAL_SECONDS", "60")),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
