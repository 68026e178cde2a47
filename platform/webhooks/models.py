"""Webhook subscriptions and their deliveries: where an organisation's events are POSTed, and
what each POST answered (the delivery log)."""

from __future__ import annotations

import uuid

from accounts.models import Organisation
from django.conf import settings
from django.db import models


class Webhook(models.Model):
    """An HTTPS endpoint that receives the organisation's events of the listed types (all if none),
    each signed with ``secret`` (HMAC-SHA256, see webhooks/signing.py). The secret is kept as is:
    signing needs it; the API shows it only when it is made."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    event_types = models.JSONField(default=list, blank=True)  # [] : every type
    description = models.CharField(max_length=200, blank=True)
    secret = models.CharField(max_length=100)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.url

    def wants(self, event_type: str) -> bool:
        return self.active and (not self.event_types or event_type in self.event_types)


class WebhookDelivery(models.Model):
    """One event sent to one webhook: retried with exponential backoff until the endpoint answers
    2xx or the attempts run out. ``log`` holds every attempt (time, status, error, duration)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.BigIntegerField()  # the event feed's id (GET /api/v1/audit/)
    event_type = models.CharField(max_length=64)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # when the next attempt is due; while an attempt runs, a lease (a worker that dies frees it)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    log = models.JSONField(default=list, blank=True)
    redelivery_of = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="webhook_delivery_due"),
            models.Index(fields=["webhook", "-created_at"], name="webhook_delivery_log"),
        ]
