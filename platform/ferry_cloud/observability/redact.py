"""Defence in depth: no secret reaches a log line, even when a caller logs one by mistake.

Two passes over every event: values under secret-bearing keys are replaced whole, and strings
anywhere else lose what looks like one of Ferry's secrets (API tokens, enrolment tokens, device
credentials, Authorization schemes, passwords inside URLs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"

# A key is secret-bearing when its lower-cased name contains one of these.
SECRET_KEY_PARTS = (
    "password",
    "passwd",
    "token",
    "secret",
    "credential",
    "authorization",
    "cookie",
    "api_key",
    "apikey",
    "private_key",
    "sessionid",
)

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # "Authorization: Token <key>", "Bearer <credential>", "Basic <b64>"
    (re.compile(r"\b(Bearer|Token|Basic)\s+[^\s,;\"']+", re.IGNORECASE), r"\1 " + REDACTED),
    # one-time enrolment tokens "fet_" + urlsafe base64, API tokens "fat_<id>_" + urlsafe base64
    (re.compile(r"\bf[ae]t_[A-Za-z0-9_-]{8,}"), REDACTED),
    # device credentials "<device uuid>.<secret>": the device id stays, the secret goes
    (
        re.compile(
            r"\b([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\.[A-Za-z0-9_-]{16,}"
        ),
        r"\1." + REDACTED,
    ),
    # DRF API tokens: exactly 40 hex digits (sha256 digests, 64, do not match)
    (re.compile(r"(?<![0-9a-fA-F])[0-9a-f]{40}(?![0-9a-fA-F])"), REDACTED),
    # "password=...", "token: ...", "secret='...'" written into a message
    (
        re.compile(r"\b(password|passwd|secret|token|api_key)(\s*[=:]\s*[\"']?)[^\s\"',;&]+", re.IGNORECASE),
        r"\1\2" + REDACTED,
    ),
    # user:password@ in URLs (database, broker)
    (re.compile(r"(://[^/\s:@]+):[^/\s@]+@"), r"\1:" + REDACTED + "@"),
)

_MAX_DEPTH = 6


def is_secret_key(key: object) -> bool:
    name = str(key).lower()
    return any(part in name for part in SECRET_KEY_PARTS)


def scrub_text(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def scrub(value: Any, depth: int = 0) -> Any:
    """The value with secrets removed: mappings by key, strings by pattern, containers recursively."""
    if isinstance(value, str):
        return scrub_text(value)
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_key(k) else scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(scrub(v, depth + 1) for v in value)
    return value


def redact_secrets(_logger: object, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: run last before rendering, after exceptions were formatted to text."""
    return {
        key: REDACTED if is_secret_key(key) and key != "event" else scrub(value)
        for key, value in event_dict.items()
    }
