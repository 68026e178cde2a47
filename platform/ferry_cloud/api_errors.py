"""One error shape for the whole REST API: {"error": {"code", "message", "fields"?}}.

The REST door's half of the domain errors (ferry_cloud/errors.py): which HTTP status each
family of refusal gets. Services never see a status code. DRF's own refusals (401, 403, 405,
415, 429, a malformed body), Django's (an unknown route, a body too large) and anything
unexpected (500) are answered in the same shape, so a client reads one format.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from ferry_cloud.errors import Conflict, DomainError, Invalid, NotFound, PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

API_PREFIX = "/api/"


class PreconditionFailed(Conflict):
    """If-Match named a representation the resource no longer has."""

    code = "precondition_failed"


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


# First match wins; a DomainError of no family here is a bad request.
STATUS_OF: tuple[tuple[type[DomainError], int], ...] = (
    (NotFound, status.HTTP_404_NOT_FOUND),
    (PreconditionFailed, status.HTTP_412_PRECONDITION_FAILED),
    (Conflict, status.HTTP_409_CONFLICT),
    (PermissionDenied, status.HTTP_403_FORBIDDEN),
    (Unauthenticated, status.HTTP_401_UNAUTHORIZED),
    (Invalid, status.HTTP_400_BAD_REQUEST),
)


def status_for(exc: DomainError) -> int:
    return next((code for family, code in STATUS_OF if isinstance(exc, family)), status.HTTP_400_BAD_REQUEST)


def error_body(code: str, message: str, fields: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return {"error": body}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, str(exc), exc.fields), status=status_for(exc))
    if isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:  # a bug: log it whole, tell the client only that it happened
        log.error("unhandled error in %s", context.get("view").__class__.__name__, exc_info=exc)
        set_rollback()
        return Response(
            error_body("server_error", "The server failed; the error is logged."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    data = response.data
    if isinstance(exc, exceptions.ValidationError):
        fields = data if isinstance(data, dict) else {"non_field_errors": data}
        response.data = error_body("invalid", "The request has invalid fields.", fields)
    elif isinstance(data, dict) and "detail" in data:
        response.data = error_body(getattr(data["detail"], "code", "error"), str(data["detail"]))
    else:
        response.data = error_body("error", str(data))
    return response


def _json_error(status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


def _slash_hint(path: str) -> str:
    if path.endswith("/"):
        return ""
    try:
        resolve(path + "/")
    except Resolver404:
        return ""
    return f" API paths end with a slash: {path}/"


@csrf_exempt
def api_not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any path under /api/ that no endpoint serves, including one missing its trailing slash
    (a redirect would turn a POST into a GET and drop its body)."""
    path = request.path
    return _json_error(404, "not_found", f"No endpoint at {path}.{_slash_hint(path)}")


# Django's own error views, answering JSON under /api/ and the usual pages elsewhere.


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        if isinstance(exception, RequestDataTooBig):
            return _json_error(413, "request_too_large", "The request body is too large.")
        return _json_error(400, "bad_request", "The request is malformed.")
    return defaults.bad_request(request, exception)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return _json_error(403, "permission_denied", "You may not do this.")
    return defaults.permission_denied(request, exception)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return api_not_found(request)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return _json_error(500, "server_error", "The server failed; the error is logged.")
    return defaults.server_error(request)
