"""The request id: taken from a well-formed X-Request-ID or generated, then bound to the log context.

It lives in structlog's contextvars, so every log line of a request (and of the Celery task
it enqueues, see celery_signals) carries it without being passed around.
"""

from __future__ import annotations

import re
import uuid

import structlog

REQUEST_ID_HEADER = "X-Request-ID"
# What a caller may choose: short, printable, no spaces or separators that could forge log fields.
_WELL_FORMED = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id_from(value: str | None) -> str:
    """The caller's id when it is well formed, otherwise a fresh one (never echo arbitrary input)."""
    if value and _WELL_FORMED.match(value):
        return value
    return new_request_id()


def current_request_id() -> str | None:
    return structlog.contextvars.get_contextvars().get("request_id")
