"""Celery: the request id travels in the task message's headers; one log line per task run.

before_task_publish runs in the process that enqueues (the web request, or a task that
enqueues another) and copies the bound request id into the headers; task_prerun binds it,
with the task's name and id, to the worker's log context; task_postrun logs the outcome.
"""

from __future__ import annotations

import logging
import logging.config
import time
from typing import Any

import structlog
from celery import signals

from ferry_cloud.observability.context import current_request_id, new_request_id

HEADER = "ferry_request_id"
log = structlog.get_logger("ferry.task")
_started: dict[str, float] = {}  # task id -> perf_counter at prerun (a worker runs a few at a time)


def _on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None and HEADER not in headers:
        headers[HEADER] = current_request_id() or new_request_id()


def _on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    request_id = getattr(task.request, HEADER, None) if task is not None else None
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(
        request_id=request_id or new_request_id(), task=getattr(task, "name", None), task_id=task_id
    )
    if task_id:
        _started[task_id] = time.perf_counter()


def _on_postrun(task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    started = _started.pop(task_id, None) if task_id else None
    duration_ms = None if started is None else round((time.perf_counter() - started) * 1000.0, 3)
    level = logging.ERROR if state == "FAILURE" else logging.INFO
    log.log(level, "task", state=state, duration_ms=duration_ms)
    structlog.contextvars.clear_contextvars()


def _on_setup_logging(**_: Any) -> None:
    """Celery would install its own handlers; Ferry's LOGGING (structlog) applies instead."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


def connect() -> None:
    """Hook the handlers up (weak=False: the functions live as long as the module anyway)."""
    signals.before_task_publish.connect(_on_publish, weak=False, dispatch_uid="ferry-request-id-publish")
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="ferry-task-prerun")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="ferry-task-postrun")
    signals.setup_logging.connect(_on_setup_logging, weak=False, dispatch_uid="ferry-setup-logging")
