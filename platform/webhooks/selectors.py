"""Reads for webhooks, always scoped to one organisation."""

from __future__ import annotations

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from ferry_cloud.errors import NotFound

from webhooks.models import Webhook, WebhookDelivery


class WebhookNotFound(NotFound):
    code = "not_found"


def webhook_list(*, organisation: Organisation) -> QuerySet[Webhook]:
    return Webhook.objects.filter(organisation=organisation)


def webhook_get(*, organisation: Organisation, webhook_id) -> Webhook:
    try:
        return Webhook.objects.get(organisation=organisation, pk=webhook_id)
    except (Webhook.DoesNotExist, ValidationError, ValueError):
        raise WebhookNotFound(f"No webhook {webhook_id} in your organisation.") from None


def delivery_list(*, webhook: Webhook, state: str | None = None) -> QuerySet[WebhookDelivery]:
    rows = WebhookDelivery.objects.filter(webhook=webhook)
    return rows.filter(state=state) if state else rows


def delivery_get(*, webhook: Webhook, delivery_id) -> WebhookDelivery:
    try:
        return WebhookDelivery.objects.select_related("webhook").get(webhook=webhook, pk=delivery_id)
    except (WebhookDelivery.DoesNotExist, ValidationError, ValueError):
        raise WebhookNotFound(f"No delivery {delivery_id} of webhook {webhook.pk}.") from None
