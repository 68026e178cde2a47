"""One error shape for the whole REST API: {"error": {"code", "message", "fields"}}.

The REST door's half of the domain errors (ferry_cloud/errors.py): which HTTP status each
family of refusal gets. Services never see a status code.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ferry_cloud.errors import Conflict, DomainError, Invalid, NotFound, PermissionDenied, Unauthenticated

# First match wins; a DomainError of no family here is a bad request.
STATUS_OF: tuple[tuple[type[DomainError], int], ...] = (
    (NotFound, status.HTTP_404_NOT_FOUND),
    (Conflict, status.HTTP_409_CONFLICT),
    (PermissionDenied, status.HTTP_403_FORBIDDEN),
    (Unauthenticated, status.HTTP_401_UNAUTHORIZED),
    (Invalid, status.HTTP_400_BAD_REQUEST),
)


def status_for(exc: DomainError) -> int:
    return next((code for family, code in STATUS_OF if isinstance(exc, family)), status.HTTP_400_BAD_REQUEST)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        body: dict[str, Any] = {"code": exc.code, "message": str(exc)}
        if exc.fields:
            body["fields"] = exc.fields
        return Response({"error": body}, status=status_for(exc))
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and set(data) == {"detail"}:
        body = {"code": getattr(data["detail"], "code", "error"), "message": str(data["detail"])}
    else:
        body = {"code": "invalid", "message": "The request has invalid fields.", "fields": data}
    response.data = {"error": body}
    return response
