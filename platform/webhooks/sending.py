"""One HTTP attempt of a webhook delivery: the signed POST and what came back.

Outside production (FERRY_WEBHOOK_ALLOW_PRIVATE, default on there) any address may receive; in
production a URL whose host resolves to a loopback, private, link-local or otherwise reserved
address is refused at each attempt, so a webhook cannot be pointed at the control plane's own
network (the metadata service, Redis, the database).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from webhooks.models import WebhookDelivery
from webhooks.signing import HEADER, sign

USER_AGENT = "Ferry-Webhooks/1"
RESPONSE_KEPT = 200  # characters of the receiver's answer kept in the log


@dataclass(frozen=True)
class Result:
    status_code: int | None
    error: str
    duration_ms: float
    response: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    def as_log(self, at: datetime, attempt: int) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "at": at.isoformat(),
            "status_code": self.status_code,
            "error": self.error,
            "duration_ms": round(self.duration_ms, 1),
            "response": self.response,
        }


class AddressRefused(Exception):
    pass


def _check_address(url: str) -> None:
    if settings.FERRY_WEBHOOK_ALLOW_PRIVATE:
        return
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise AddressRefused(f"cannot resolve {host}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise AddressRefused(
                f"{host} resolves to {address}, not a public address "
                "(FERRY_WEBHOOK_ALLOW_PRIVATE=1 allows it)"
            )


def post(*, delivery: WebhookDelivery, body: bytes) -> Result:
    """POST the body to the webhook's URL, signed; never raises (the failure is the result)."""
    webhook = delivery.webhook
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        HEADER: sign(webhook.secret, body),
        "Ferry-Event": delivery.event_type,
        "Ferry-Event-Id": str(delivery.event_id),
        "Ferry-Delivery": str(delivery.pk),
    }
    started = time.perf_counter()
    try:
        _check_address(webhook.url)
        answer = httpx.post(
            webhook.url,
            content=body,
            headers=headers,
            timeout=float(settings.FERRY_WEBHOOK_TIMEOUT_SECONDS),
            follow_redirects=False,  # a redirect is an answer that is not 2xx: a failure
        )
    except AddressRefused as exc:
        return Result(None, f"refused: {exc}", _ms(started))
    except httpx.HTTPError as exc:
        return Result(None, f"{type(exc).__name__}: {exc}"[:500], _ms(started))
    error = "" if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
    return Result(answer.status_code, error, _ms(started), answer.text[:RESPONSE_KEPT])


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
