"""One structured log line per HTTP request, and the request id that follows it everywhere.

The id comes from a well-formed X-Request-ID or is generated; it is bound to structlog's
context (so every line of the request carries it, and Celery tasks enqueued by the request
receive it) and returned in the response's X-Request-ID header.  Headers, cookies and the
query string are never logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import structlog
from django.http import HttpRequest, HttpResponse
from django.utils.functional import empty

from ferry_cloud.observability.context import REQUEST_ID_HEADER, request_id_from

log = structlog.get_logger("ferry.request")
# Probes and scrapes arrive every few seconds: their lines are debug, not info.
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_ORGANISATION_TTL_SECONDS = 60.0
_organisations: dict[int, tuple[int | None, float]] = {}  # user id -> (organisation id, expiry)


class RequestLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
        request.request_id = request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        status = 500  # what the client gets if the stack below raises
        try:
            response = self.get_response(request)
            status = response.status_code
            response[REQUEST_ID_HEADER] = request_id
            return response
        finally:
            _log_request(request, status, (time.perf_counter() - started) * 1000.0)
            structlog.contextvars.clear_contextvars()


def _log_request(request: HttpRequest, status: int, duration_ms: float) -> None:
    match = getattr(request, "resolver_match", None)
    fields = {
        "method": request.method,
        "path": request.path,
        "view": match.view_name if match else None,
        "status": status,
        "duration_ms": round(duration_ms, 3),
        **_who(request),
    }
    if status >= 500:
        level = logging.ERROR
    elif request.path in QUIET_PATHS:
        level = logging.DEBUG
    else:
        level = logging.INFO
    log.log(level, "request", **fields)


def _who(request: HttpRequest) -> dict[str, int]:
    """The authenticated user and organisation, without loading a session nobody asked for."""
    user = request.__dict__.get("user")
    if user is None or getattr(user, "_wrapped", None) is empty:
        return {}  # the lazy user was never evaluated: reading it now would cost a query
    if not getattr(user, "is_authenticated", False):
        return {}
    who = {"user_id": user.pk}
    organisation_id = _organisation_of(user)
    if organisation_id is not None:
        who["organisation_id"] = organisation_id
    return who


def _organisation_of(user) -> int | None:
    """Cached a minute per process: a log line is not worth a query on every request."""
    now = time.monotonic()
    cached = _organisations.get(user.pk)
    if cached and cached[1] > now:
        return cached[0]
    from accounts.selectors import NoOrganisation, organisation_for_user

    try:
        organisation_id = organisation_for_user(user=user).pk
    except NoOrganisation:
        organisation_id = None
    if len(_organisations) > 10_000:
        _organisations.clear()
    _organisations[user.pk] = (organisation_id, now + _ORGANISATION_TTL_SECONDS)
    return organisation_id
