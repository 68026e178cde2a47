"""Rate limits on the REST API: per API token (or session user), per IP address for anonymous calls.

A DRF throttle (REST_FRAMEWORK's DEFAULT_THROTTLE_CLASSES) counts each caller's requests in a fixed
window in Django's cache: Redis when REDIS_URL is set, so every web worker and replica shares one
count; process memory in the embedded demo. Counting is one atomic ``add`` + ``incr``, not DRF's
list of timestamps read and rewritten per request (racy across workers, and 600 floats to pickle).

Every throttled endpoint answers the draft IETF headers (RateLimit-Limit, RateLimit-Remaining,
RateLimit-Reset, RateLimit-Policy); over the limit it is a 429 in the API's error format with
Retry-After. One rate for every role: the limit protects the server, and an admin's runaway
script loads it as much as anyone's; raise FERRY_API_RATE for heavier automation.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from functools import cache as cache_result

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

log = logging.getLogger(__name__)

PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
PERIODS.update({"d": 86400, "day": 86400})
RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*$")
ATTRIBUTE = "_ferry_rate_limit"  # on the Django request: what the middleware turns into headers


@dataclass(frozen=True)
class Rate:
    requests: int
    seconds: int

    def describe(self) -> str:
        return f"{self.requests} requests per {self.seconds} s"


@cache_result
def parse_rate(text: str) -> Rate | None:
    """ "600/min", "10/s", "5000/hour", "100/5min"; "" or "off": no limit."""
    if text.strip().lower() in ("", "off", "none", "0"):
        return None
    match = RATE.match(text.lower())
    if not match or match.group(3) not in PERIODS or int(match.group(1)) < 1:
        raise ImproperlyConfigured(
            f"rate {text!r}: expected <requests>/<period> with a period of s, min, hour or day "
            "(optionally a multiple: 100/5min), or 'off'"
        )
    multiple = int(match.group(2) or 1)
    return Rate(int(match.group(1)), PERIODS[match.group(3)] * max(1, multiple))


@dataclass(frozen=True)
class Decision:
    rate: Rate
    used: int
    reset: int  # seconds until the window ends

    @property
    def remaining(self) -> int:
        return max(0, self.rate.requests - self.used)


class RateLimited(exceptions.Throttled):
    """429 {"error": {"code": "throttled"}}, with Retry-After (DRF's handler sets it from wait)."""


class ApiRateThrottle(BaseThrottle):
    """FERRY_API_RATE per API token (a session: per user); FERRY_API_ANON_RATE per client IP."""

    def allow_request(self, request, view) -> bool:
        rate, ident, who = self._rate_and_ident(request)
        if rate is None:
            return True
        try:
            decision = _count(f"ferry:rl:{ident}", rate)
        except Exception:  # noqa: BLE001 - a cache outage must not take the API down with it
            log.warning("rate limit not applied: the cache failed", exc_info=True)
            return True
        setattr(request._request, ATTRIBUTE, decision)
        if decision.used <= rate.requests:
            return True
        raise RateLimited(
            wait=decision.reset,
            detail=f"Rate limit reached: {rate.describe()} for {who} (see the RateLimit-* headers).",
        )

    def _rate_and_ident(self, request) -> tuple[Rate | None, str, str]:
        token = getattr(request, "auth", None)
        if token is not None and hasattr(token, "pk"):
            # the creation time as well as the id: ids restart with a new database, tokens do not
            stamp = int(token.created_at.timestamp() * 1e6) if token.created_at else 0
            return _setting_rate("FERRY_API_RATE"), f"token:{token.pk}:{stamp}", "this API token"
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return _setting_rate("FERRY_API_RATE"), f"user:{user.pk}", "your session"
        return _setting_rate("FERRY_API_ANON_RATE"), f"ip:{self.get_ident(request)}", "your address"


def _setting_rate(name: str) -> Rate | None:
    """Read at each request, so a settings override (tests, a reload) takes effect."""
    return parse_rate(str(getattr(settings, name, "") or ""))


def _count(key: str, rate: Rate) -> Decision:
    """This request's place in the caller's current fixed window (atomic in Redis and locmem)."""
    now = time.time()
    window = int(now // rate.seconds)
    reset = max(1, math.ceil((window + 1) * rate.seconds - now))
    bucket = f"{key}:{rate.seconds}:{window}"
    cache.add(bucket, 0, timeout=rate.seconds + 1)
    try:
        used = cache.incr(bucket)
    except ValueError:  # expired between add and incr: this request opens the window
        cache.add(bucket, 1, timeout=rate.seconds + 1)
        used = 1
    return Decision(rate=rate, used=used, reset=reset)


class RateLimitHeadersMiddleware:
    """Adds the RateLimit-* headers to every answer a throttled endpoint gave (429s included)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        decision: Decision | None = getattr(request, ATTRIBUTE, None)
        if decision is not None:
            response["RateLimit-Limit"] = str(decision.rate.requests)
            response["RateLimit-Remaining"] = str(decision.remaining)
            response["RateLimit-Reset"] = str(decision.reset)
            response["RateLimit-Policy"] = f"{decision.rate.requests};w={decision.rate.seconds}"
        return response
