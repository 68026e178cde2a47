"""The domain's refusals: plain exceptions that know nothing of HTTP, gRPC or HTML.

Services and selectors raise these with a message a person can act on and a stable
machine ``code``. Each door maps the class to its own vocabulary in one place: the REST
exception handler to a status code (ferry_cloud/api_errors.py), the gateway's interceptor
to a gRPC status (gateway/errors.py), the console to a message or an error page. A new
refusal subclasses the family it belongs to, so every door already knows how to show it.

No framework is imported here, on purpose (tests/test_architecture.py checks it).
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A request the domain refuses. ``code`` is for machines; ``str(exc)`` for people.

    ``fields`` optionally names the offending inputs (input name -> list of messages).
    """

    code = "invalid"

    def __init__(self, message: str = "", *, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.fields = fields


class Invalid(DomainError):
    """The request itself is wrong (a malformed filter, an unknown option): fix it and retry."""

    code = "invalid"


class NotFound(DomainError):
    """Nothing by that id in the caller's organisation (other tenants' rows are not found either)."""

    code = "not_found"


class Conflict(DomainError):
    """The request is well formed but clashes with the current state (a duplicate name, a stale revision)."""

    code = "conflict"


class PermissionDenied(DomainError):
    """The caller is known but may not do this."""

    code = "permission_denied"


class Unauthenticated(DomainError):
    """The caller could not be identified (an unknown or revoked credential)."""

    code = "unauthenticated"
