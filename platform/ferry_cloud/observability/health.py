"""Liveness and readiness: /healthz says the process answers, /readyz that its dependencies do.

Readiness checks the database (reachable, every migration applied), the Celery broker and the
model/package storage, concurrently, each on a fresh short-timeout connection and bounded by
FERRY_READY_TIMEOUT_SECONDS, so a probe never hangs on a dead dependency.  Neither view needs
authentication or a session.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache


class NotReady(Exception):
    """A dependency answered, but not as it must (e.g. migrations missing)."""


# --- the database ---------------------------------------------------------------------------
@cache
def _latest_migrations() -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """Each app's newest migration on disk, with what it replaces (read once: the code does not change)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    return [
        (app, name, tuple(loader.graph.nodes[(app, name)].replaces or ()))
        for app, name in loader.graph.leaf_nodes()
    ]


def check_database(timeout: float, alias: str = "default") -> None:
    """Connect afresh with a short timeout, and find every app's newest migration applied."""
    wrapper = connections[alias]
    params = wrapper.get_connection_params()
    if wrapper.vendor == "postgresql":
        params["connect_timeout"] = max(1, int(timeout))
    raw = wrapper.get_new_connection(params)
    try:
        cursor = raw.cursor()
        if wrapper.vendor == "postgresql":
            cursor.execute(f"SET statement_timeout = {int(timeout * 1000)}")
        try:
            cursor.execute("SELECT app, name FROM django_migrations")
        except Exception as exc:
            raise NotReady("no migrations applied (run manage.py migrate)") from exc
        applied = {(app, name) for app, name in cursor.fetchall()}
    finally:
        raw.close()
    missing = [
        f"{app}.{name}"
        for app, name, replaces in _latest_migrations()
        if (app, name) not in applied and not (replaces and all(r in applied for r in replaces))
    ]
    if missing:
        raise NotReady(f"migrations not applied: {', '.join(sorted(missing))}")


# --- the broker ---------------------------------------------------------------------------
def check_broker(timeout: float) -> None:
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis://", "rediss://", "unix://")):
        import redis

        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
        return
    from kombu import Connection

    with Connection(url, connect_timeout=timeout) as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout)


# --- storage --------------------------------------------------------------------------------
def check_storage(timeout: float) -> None:
    from django.core.files.storage import default_storage

    bucket = getattr(default_storage, "bucket_name", None)
    if bucket:
        _check_s3(default_storage, bucket, timeout)
        return
    location = getattr(default_storage, "location", None)
    if location is not None:
        os.makedirs(location, exist_ok=True)
        if not os.access(location, os.W_OK):
            raise NotReady(f"storage directory {location} is not writable")
        return
    default_storage.exists(".ferry-readyz")  # any other backend: one cheap call


def _check_s3(storage, bucket: str, timeout: float) -> None:
    """HEAD the bucket on a client of our own: storage's client retries for a minute by design."""
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=getattr(storage, "endpoint_url", None) or None,
        region_name=getattr(storage, "region_name", None) or None,
        aws_access_key_id=getattr(storage, "access_key", None) or None,
        aws_secret_access_key=getattr(storage, "secret_key", None) or None,
        aws_session_token=getattr(storage, "security_token", None) or None,
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1}),
    )
    client.head_bucket(Bucket=bucket)


# --- running them ---------------------------------------------------------------------------
CHECKS: dict[str, Callable[[float], None]] = {
    "database": check_database,
    "broker": check_broker,
    "storage": check_storage,
}


def _run(check: Callable[[float], None], timeout: float, results: dict, name: str) -> None:
    started = time.perf_counter()
    try:
        check(timeout)
        results[name] = {"ok": True}
    except Exception as exc:  # any failure means not ready; its message says why
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    results[name]["duration_ms"] = round((time.perf_counter() - started) * 1000.0, 1)


def readiness(timeout: float | None = None) -> dict[str, dict]:
    """Every check, run concurrently; one still running after the timeout counts as failed."""
    timeout = settings.FERRY_READY_TIMEOUT_SECONDS if timeout is None else timeout
    results: dict[str, dict] = {}
    threads = [
        threading.Thread(
            target=_run, args=(check, timeout, results, name), daemon=True, name=f"readyz-{name}"
        )
        for name, check in CHECKS.items()
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout + 0.5
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for name in CHECKS:
        results.setdefault(name, {"ok": False, "error": f"no answer within {timeout:g} s"})
    return {name: results[name] for name in CHECKS}


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    checks = readiness()
    failing = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "unavailable" if failing else "ok", "failing": failing, "checks": checks}
    return JsonResponse(body, status=503 if failing else 200)
