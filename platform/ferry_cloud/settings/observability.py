"""Metrics, health and readiness: django-prometheus, the database instrumentation, probe timeouts.

PROMETHEUS_MULTIPROC_DIR (read by prometheus-client itself) switches to multiprocess mode: set
it for the gunicorn web role only (an empty directory per deployment, see the README), so the
/metrics of any worker sums every worker's counters.
"""

from __future__ import annotations

import os

from . import database as _database

# Count every query of every process (django_db_execute_total, django_db_query_duration_seconds):
# the same backends, wrapped by django-prometheus.
_INSTRUMENTED = {
    "django.db.backends.postgresql": "django_prometheus.db.backends.postgresql",
    "django.db.backends.sqlite3": "django_prometheus.db.backends.sqlite3",
}
for _db in _database.DATABASES.values():
    _db["ENGINE"] = _INSTRUMENTED.get(_db["ENGINE"], _db["ENGINE"])

# django-prometheus: /metrics is Ferry's own view (it adds the domain gauges once per scrape).
PROMETHEUS_EXPORT_MIGRATIONS = False  # it would query the database at every process start
PROMETHEUS_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    float("inf"),
)

# /readyz: each dependency gets this long (seconds) before it counts as down.
FERRY_READY_TIMEOUT_SECONDS = float(os.environ.get("FERRY_READY_TIMEOUT_SECONDS", "2"))
# A device is "online" when it checked in within this many seconds (default: 3 check-in intervals,
# plus the minute at which check-ins that change nothing record last_seen_at).
FERRY_DEVICE_ONLINE_SECONDS = int(
    os.environ.get(
        "FERRY_DEVICE_ONLINE_SECONDS",
        str(3 * int(os.environ.get("FERRY_CHECKIN_INTERVAL_SECONDS", "30")) + 60),
    )
)
# The gateway's Prometheus port (0 or unset: no metrics server); `manage.py gateway --metrics-port`.
FERRY_GATEWAY_METRICS_PORT = int(os.environ.get("FERRY_GATEWAY_METRICS_PORT", "0") or 0)
FERRY_GATEWAY_METRICS_ADDRESS = os.environ.get("FERRY_GATEWAY_METRICS_ADDRESS", "127.0.0.1")

# Celery keeps its hands off logging (ferry_cloud.celery applies LOGGING instead).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
