"""Webhook signatures, like Stripe's: ``Ferry-Signature: t=<unix time>,v1=<hex>`` where v1 is
HMAC-SHA256(secret, "<t>." + body). A receiver recomputes it over the raw body, compares in
constant time and refuses a timestamp older than its tolerance (a replayed request).

Standard library only: receivers may copy this file.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "Ferry-Signature"
SCHEME = "v1"
TOLERANCE_SECONDS = 300


class SignatureInvalid(Exception):
    """The request was not signed with this secret, or not recently."""


def signature(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return mac.hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The Ferry-Signature header value for ``body``."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return f"t={timestamp},{SCHEME}={signature(secret, body, timestamp)}"


def verify(
    secret: str, body: bytes, header: str, *, tolerance: int = TOLERANCE_SECONDS, now: float | None = None
) -> int:
    """The signed timestamp if ``header`` signs ``body`` with ``secret`` within ``tolerance``
    seconds; SignatureInvalid (saying why) otherwise. Several v1 values (a rotation) may be given."""
    parts = [p.split("=", 1) for p in header.split(",") if "=" in p]
    stamps = [v for k, v in parts if k.strip() == "t"]
    given = [v.strip() for k, v in parts if k.strip() == SCHEME]
    if len(stamps) != 1 or not stamps[0].strip().isdigit() or not given:
        raise SignatureInvalid(f"malformed {HEADER} header: expected t=<unix time>,{SCHEME}=<hex>")
    timestamp = int(stamps[0])
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        raise SignatureInvalid(f"timestamp {timestamp} is outside the {tolerance} s tolerance")
    expected = signature(secret, body, timestamp)
    if not any(hmac.compare_digest(expected, value) for value in given):
        raise SignatureInvalid("no signature matches: wrong secret, or the body was altered")
    return timestamp
