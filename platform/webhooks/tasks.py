"""Celery doors onto webhook services: they take ids and hold no logic."""

from __future__ import annotations

from celery import shared_task

from webhooks.services import deliveries_send_due, delivery_attempt


@shared_task(acks_late=True, ignore_result=True)
def deliver_webhook(delivery_id: str) -> None:
    delivery_attempt(delivery_id=delivery_id)


def send_delivery(delivery_id: str, countdown: float | None = None) -> None:
    """The webhooks' queue port (WebhooksConfig.ready registers it)."""
    deliver_webhook.apply_async((delivery_id,), countdown=countdown)


@shared_task(ignore_result=True)
def send_due_webhooks() -> list[str]:
    """Run by celery beat: deliveries whose message was lost or whose wait was long."""
    return deliveries_send_due()
