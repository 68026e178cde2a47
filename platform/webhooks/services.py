"""Webhooks: subscriptions, and deliveries with retries (exponential backoff) and a log.

A recorded event becomes one delivery row per subscribed webhook (durable before anything is
sent), then a message to a worker through the port the app registers (tasks.send_delivery).
An attempt claims its row with a lease (an atomic UPDATE), so two workers never send the same
delivery at once and one that dies mid-send frees it for the sweeper. Short waits between
attempts ride on the message (a countdown); longer ones, and messages lost with a broker
outage, are picked up by celery beat's sweep (deliveries_due).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from accounts.models import Organisation
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from ferry_cloud.errors import Invalid
from ferry_cloud.events import EVENT_TYPES

from webhooks import sending
from webhooks.models import Webhook, WebhookDelivery

log = logging.getLogger(__name__)
State = WebhookDelivery.State
LOG_ENTRIES = 25  # attempts kept per delivery
COUNTDOWN_MAX_SECONDS = 300  # longer waits are the sweeper's (a message held that long may be lost)
SWEEP_GRACE = timedelta(seconds=30)  # a due delivery's own message gets this long before the sweep

_queue: dict[str, Callable[[str, float | None], None]] = {}


class InvalidWebhook(Invalid):
    code = "invalid_webhook"


def delivery_queue_register(*, send: Callable[[str, float | None], None]) -> None:
    """Say how a delivery (by id) reaches a worker, now or after ``countdown`` seconds."""
    _queue["send"] = send


def _enqueue(delivery_id, countdown: float | None = None) -> None:
    """Hand the delivery to a worker; if that fails it stays pending and the sweep sends it."""
    send = _queue.get("send")
    if send is None:
        log.warning("no webhook queue registered; delivery %s waits for the sweep", delivery_id)
        return
    try:
        send(str(delivery_id), countdown)
    except Exception:  # kombu raises many types; any of them means "not sent" - the sweep will
        log.warning("could not enqueue webhook delivery %s; the sweep will", delivery_id, exc_info=True)


# --- subscriptions ------------------------------------------------------------------------------


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def _check_types(event_types: list[str]) -> list[str]:
    unknown = sorted(set(event_types) - set(EVENT_TYPES))
    if unknown:
        raise InvalidWebhook(
            f"Unknown event type(s): {', '.join(unknown)}; use any of {', '.join(EVENT_TYPES)}.",
            fields={"event_types": [f"unknown: {', '.join(unknown)}"]},
        )
    return sorted(set(event_types))


def webhook_create(
    *, organisation: Organisation, url: str, event_types: list[str], description: str = "", actor=None
) -> Webhook:
    """A new subscription with a new secret (the caller shows it once)."""
    return Webhook.objects.create(
        organisation=organisation,
        url=url,
        event_types=_check_types(event_types),
        description=description,
        secret=new_secret(),
        created_by=actor,
    )


def webhook_update(*, webhook: Webhook, **changes: Any) -> Webhook:
    """Change url, event_types, description or active (what is given)."""
    if "event_types" in changes:
        changes["event_types"] = _check_types(changes["event_types"])
    for name, value in changes.items():
        setattr(webhook, name, value)
    webhook.save()
    return webhook


def webhook_rotate_secret(*, webhook: Webhook) -> Webhook:
    webhook.secret = new_secret()
    webhook.save(update_fields=["secret", "updated_at"])
    return webhook


def webhook_delete(*, webhook: Webhook) -> None:
    webhook.delete()  # its deliveries go with it; pending ones are never sent


# --- deliveries ---------------------------------------------------------------------------------


def webhooks_listening(*, organisation_id: int) -> bool:
    return Webhook.objects.filter(organisation_id=organisation_id, active=True).exists()


def deliveries_create(
    *, organisation_id: int, event_id: int, event_type: str, payload: dict[str, Any]
) -> list[WebhookDelivery]:
    """A pending delivery of the event to each active webhook that wants its type, each sent
    to a worker once the rows are committed."""
    hooks = [
        h for h in Webhook.objects.filter(organisation_id=organisation_id, active=True) if h.wants(event_type)
    ]
    now = timezone.now()
    created = [
        WebhookDelivery.objects.create(
            webhook=hook, event_id=event_id, event_type=event_type, payload=payload, next_attempt_at=now
        )
        for hook in hooks
    ]
    for delivery in created:
        transaction.on_commit(lambda pk=delivery.pk: _enqueue(pk))
    return created


def delivery_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """The same event, body and webhook again, as a new delivery (the old one's log stays)."""
    again = WebhookDelivery.objects.create(
        webhook=delivery.webhook,
        event_id=delivery.event_id,
        event_type=delivery.event_type,
        payload=delivery.payload,
        next_attempt_at=timezone.now(),
        redelivery_of=delivery,
    )
    transaction.on_commit(lambda: _enqueue(again.pk))
    return again


def retry_delay(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: base, 2 base, 4 base, ... capped."""
    base = float(settings.FERRY_WEBHOOK_RETRY_BASE_SECONDS)
    return min(base * 2 ** max(0, attempts - 1), float(settings.FERRY_WEBHOOK_RETRY_MAX_SECONDS))


def _claim(delivery_id, now) -> bool:
    lease = now + timedelta(seconds=float(settings.FERRY_WEBHOOK_TIMEOUT_SECONDS) + 30)
    return bool(
        WebhookDelivery.objects.filter(pk=delivery_id, state=State.PENDING, next_attempt_at__lte=now).update(
            next_attempt_at=lease
        )
    )


def delivery_attempt(*, delivery_id) -> WebhookDelivery | None:
    """Send the delivery once if it is due (None if it is not: done, or another worker has it),
    record the answer, and schedule the next attempt after a failure."""
    now = timezone.now()
    if not _claim(delivery_id, now):
        return None
    delivery = WebhookDelivery.objects.select_related("webhook").get(pk=delivery_id)
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    result = sending.post(delivery=delivery, body=body)
    delivery.attempts += 1
    delivery.last_status_code = result.status_code
    delivery.last_error = result.error[:500]
    delivery.log = [*delivery.log, result.as_log(now, delivery.attempts)][-LOG_ENTRIES:]
    delay = None
    if result.ok:
        delivery.state, delivery.delivered_at, delivery.next_attempt_at = (
            State.SUCCEEDED,
            timezone.now(),
            None,
        )
    elif delivery.attempts >= int(settings.FERRY_WEBHOOK_MAX_ATTEMPTS):
        delivery.state, delivery.next_attempt_at = State.FAILED, None
    else:
        delay = retry_delay(delivery.attempts)
        delivery.next_attempt_at = timezone.now() + timedelta(seconds=delay)
    delivery.save()
    if delay is not None and delay <= COUNTDOWN_MAX_SECONDS:
        _enqueue(delivery.pk, delay)
    return delivery


def deliveries_due(*, now=None, limit: int = 1000) -> list[str]:
    """Pending deliveries whose time came a while ago: their message was lost, their wait was
    longer than a countdown, or their worker died mid-send (its lease ran out)."""
    now = now or timezone.now()
    rows = WebhookDelivery.objects.filter(state=State.PENDING, next_attempt_at__lte=now - SWEEP_GRACE)
    return [str(pk) for pk in rows.order_by("next_attempt_at").values_list("pk", flat=True)[:limit]]


def deliveries_send_due() -> list[str]:
    """The sweep (celery beat): every due delivery to a worker."""
    due = deliveries_due()
    for delivery_id in due:
        _enqueue(delivery_id)
    return due
