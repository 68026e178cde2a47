"""Celery: Redis when REDIS_URL is set, otherwise an embedded SQLite broker.

The embedded broker's URL names Ferry's race-free SQLAlchemy transport (ferry_cloud/broker.py),
so worker, beat and web may start in any order.
"""

from __future__ import annotations

import os

from .base import DATA_DIR

# --- Celery: Redis when REDIS_URL is set, otherwise a SQLite broker that needs no server -----
CELERY_BROKER_URL = os.environ.get("REDIS_URL") or f"ferrysqla+sqlite:///{DATA_DIR / 'celery-broker.sqlite3'}"
# acks_late: a task is acknowledged when it ends, so a worker lost mid-task leaves it unacknowledged.
# Neither broker redelivers promptly after a SIGKILL (Redis after its 1 h visibility timeout, the
# SQLite transport never), so the job rows plus a sweeper are what bring a conversion back:
# registry.services.conversion_requeue_stale, run by beat and at every worker start.
CELERY_TASK_ACKS_LATE = True
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
        "schedule": float(os.environ.get("FERRY_REQUEUE_INTERVAL_SECONDS", "10")),
    },
    "send-due-webhooks": {
        "task": "webhooks.tasks.send_due_webhooks",
        "schedule": float(os.environ.get("FERRY_WEBHOOK_SWEEP_SECONDS", "30")),
    },
    "roll-up-old-telemetry": {
        "task": "telemetry.tasks.roll_up_old_telemetry",
        "schedule": float(os.environ.get("FERRY_TELEMETRY_ROLLUP_INTERVAL_SECONDS", "3600")),
    },
}
# Raw telemetry is kept this many days, then rolled up per version and hour (telemetry.retention).
FERRY_TELEMETRY_RAW_DAYS = int(os.environ.get("FERRY_TELEMETRY_RAW_DAYS", "14"))
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
