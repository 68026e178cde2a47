"""gunicorn settings for the control plane's web process (REST API, console, static files).

    gunicorn -c platform/ferry_cloud/gunicorn_conf.py

Loaded by path, so the master imports neither Django nor the Celery app: each worker loads
the WSGI app after the fork and opens its own database connections. Everything comes from
the environment (docker/compose.yaml); the defaults suit one small container.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

wsgi_app = "ferry_cloud.wsgi:application"
bind = [os.environ.get("FERRY_WEB_BIND", "0.0.0.0:8000")]

# Threads in each worker: a slow upload (ONNX models up to FERRY_MAX_UPLOAD_BYTES) holds a
# thread, not the whole worker, and gthread workers heartbeat from their main thread, so
# `timeout` only reaps a worker that hangs, never a long request.
workers = int(os.environ.get("FERRY_WEB_WORKERS", "2"))
threads = int(os.environ.get("FERRY_WEB_THREADS", "4"))
worker_class = "gthread"
timeout = int(os.environ.get("FERRY_WEB_TIMEOUT", "60"))
# On SIGTERM (docker stop, a rolling update) workers finish their requests for this long;
# keep it below the orchestrator's kill timeout (compose: stop_grace_period).
graceful_timeout = int(os.environ.get("FERRY_WEB_GRACEFUL_TIMEOUT", "25"))
keepalive = int(os.environ.get("FERRY_WEB_KEEPALIVE", "5"))
# Recycling bounds slow leaks; the jitter keeps workers from restarting together.
max_requests = int(os.environ.get("FERRY_WEB_MAX_REQUESTS", "0"))
max_requests_jitter = max_requests // 10

# The app logs one structured line per request; gunicorn's own access log would double it.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("FERRY_LOG_LEVEL", "info").lower()
# X-Forwarded-* is believed only from these peers (a proxy in front of the container).
forwarded_allow_ips = os.environ.get("FERRY_FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
# Heartbeat files in memory: /tmp in a container may be overlayfs, where fsync stalls workers.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
# The control socket defaults to one path per user ($HOME/.gunicorn): several gunicorns on a
# host (tests, replicas sharing a home) would fight over it. On only when a path is given.
control_socket_disable = not os.environ.get("FERRY_WEB_CONTROL_SOCKET")
if not control_socket_disable:
    control_socket = os.environ["FERRY_WEB_CONTROL_SOCKET"]

# Prometheus: each worker writes its metrics to files in this directory and /metrics sums
# them (prometheus_client's multiprocess mode). Set here, before any worker imports
# prometheus_client, so every process of this server agrees on it.
_own_metrics_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR", str(Path(tempfile.gettempdir()) / f"ferry-prometheus-{os.getpid()}")
)
_metrics_dir = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])


def on_starting(server) -> None:
    """Start from no metric files: those of a previous run would be summed into this one's."""
    _metrics_dir.mkdir(parents=True, exist_ok=True)
    for stale in _metrics_dir.glob("*.db"):
        stale.unlink()


def child_exit(server, worker) -> None:
    """A worker exited (recycled, killed, crashed): its live gauges must stop counting."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    """Remove the metrics directory this config made up (one given in the environment stays)."""
    if _own_metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
