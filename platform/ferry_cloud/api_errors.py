"""One error shape for the whole REST API: {"error": {"code", "message", "fields"}}."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class ServiceError(Exception):
    """A request that the domain refuses; services raise subclasses with a message users can act on."""

    status_code = status.HTTP_400_BAD_REQUEST
    code = "invalid"


class NotFound(ServiceError):
    status_code = status.HTTP_404_NOT_FOUND
    code = "not_found"


class Conflict(ServiceError):
    status_code = status.HTTP_409_CONFLICT
    code = "conflict"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        return Response({"error": {"code": exc.code, "message": str(exc)}}, status=exc.status_code)
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
