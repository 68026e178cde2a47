import secrets
import uuid

from accounts.models import Organisation
from django.conf import settings
from django.db import models
from registry.models import ModelVersion


def _salt() -> str:
    return secrets.token_hex(8)


class Release(models.Model):
    """Which devices should run a model version; the rollout logic itself lives in deploy/."""

    class State(models.TextChoices):
        DRAFT = "draft", "Draft"
        ACTIVE = "active", "Active"
        PAUSED = "paused", "Paused"
        ABORTED = "aborted", "Aborted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="releases")
    name = models.CharField(max_length=200)
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="releases")
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT)
    # {"labels": {k: v}, "device_ids": [...], "percentage": 0..100}
    target = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    salt = models.CharField(max_length=32, default=_salt, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class ReleaseEvent(models.Model):
    """Audit log: every state change, who made it and why."""

    release = models.ForeignKey(Release, on_delete=models.CASCADE, related_name="events")
    action = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    reason = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
