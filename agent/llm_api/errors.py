"""An error the local API answers with: an HTTP status and OpenAI's error object."""

from __future__ import annotations

import json
from typing import Any


class ApiError(Exception):
    """A request refused with ``status`` and a reason the client can act on."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", code: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code or None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}


def invalid(message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code)


class ClientGone(Exception):
    """The client closed the connection mid-stream; generation stops (not counted as an error)."""


def json_object(body: bytes) -> dict[str, Any]:
    """A request body parsed as a JSON object, or ApiError 400 saying why it is not one."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid(f"the body is not valid JSON ({exc})", "invalid_json") from exc
    if not isinstance(data, dict):
        raise invalid("the body must be a JSON object", "invalid_json")
    return data
