import uuid

from accounts.models import Organisation
from django.db import models
from registry.models import ModelVersion


class EnrolmentToken(models.Model):
    """A one-time secret that lets one device join; only its sha256 is kept."""

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="enrolment_tokens")
    token_sha256 = models.CharField(max_length=64, unique=True)
    labels = models.JSONField(default=dict, blank=True)  # given to the device that uses it
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class Device(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=200)
    credential_sha256 = models.CharField(max_length=64)
    attributes = models.JSONField(default=dict, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    running_version = models.ForeignKey(
        ModelVersion, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    enrolled_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
