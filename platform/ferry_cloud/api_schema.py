"""Post-processing of the OpenAPI document: what drf-spectacular cannot see from the views.

- every operation declares its error answers, each with the one error schema (api_errors.py);
- every answer declares the rate-limit headers, and a 429 its Retry-After (throttling.py);
- numeric row ids in paths (the ``rowid`` converter) are integers, not patterned strings.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "Stable, for machines (not_found, invalid, ...)."},
                "message": {"type": "string", "description": "For people: what is wrong and what to do."},
                "fields": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "The offending inputs, by name: their messages.",
                },
            },
        }
    },
}

ALWAYS = {
    "400": "Invalid input or query parameters (each named in fields).",
    "401": "No credential, or an unknown one.",
    "403": "Your role may not do this.",
    "404": "Nothing by that id in your organisation, or no such endpoint.",
    "405": "The endpoint does not take this method.",
    "429": "Too many requests.",
    "500": "The server failed; the error is logged.",
}
ON_WRITES = {
    "409": "The request clashes with the current state (or an Idempotency-Key was reused).",
    "412": "If-Match named a representation the resource no longer has.",
    "413": "The request body is too large.",
    "415": "The body is not in the content type the endpoint takes.",
}
ROW_ID_PATTERN = "^[0-9]{1,18}$"
_SECONDS = {"type": "integer", "minimum": 0}
RATE_LIMIT_HEADERS = {
    "RateLimit-Limit": {"description": "Requests allowed in the current window.", "schema": _SECONDS},
    "RateLimit-Remaining": {"description": "Requests left in the current window.", "schema": _SECONDS},
    "RateLimit-Reset": {"description": "Seconds until the window ends.", "schema": _SECONDS},
    "RateLimit-Policy": {"description": "The limit and its window: 600;w=60.", "schema": {"type": "string"}},
    "Retry-After": {"description": "Seconds to wait before retrying (429 only).", "schema": _SECONDS},
}


def _declare_headers(responses: dict[str, Any]) -> None:
    for code, response in responses.items():
        names = [n for n in RATE_LIMIT_HEADERS if n != "Retry-After" or code == "429"]
        headers = response.setdefault("headers", {})
        for name in names:
            headers.setdefault(name, {"$ref": f"#/components/headers/{name}"})


def declare_errors(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    result["components"].setdefault("headers", {}).update(RATE_LIMIT_HEADERS)
    reference = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            errors = {**ALWAYS, **(ON_WRITES if method in ("post", "put", "patch", "delete") else {})}
            for code, description in errors.items():
                operation["responses"].setdefault(code, {"description": description, "content": reference})
            for code, response in operation["responses"].items():  # a view's own error codes
                if code.isdigit() and int(code) >= 400 and "content" not in response:
                    response["content"] = reference
            _declare_headers(operation["responses"])
            for parameter in operation.get("parameters", []):
                if parameter.get("schema", {}).get("pattern") == ROW_ID_PATTERN:
                    parameter["schema"] = {"type": "integer", "format": "int64", "minimum": 0}
    return result
