import uuid

from accounts.models import Organisation
from django.conf import settings
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
    # the client certificate issued last (enrolment or renewal); the TLS peer is the identity
    certificate_serial = models.CharField(max_length=40, blank=True)
    certificate_expires_at = models.DateTimeField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    running_version = models.ForeignKey(
        ModelVersion, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # pinned devices run this version whatever the releases say
    pinned_version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    enrolled_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # the release-key rotation the device reported holding at its last check-in (0: enrolment keys)
    release_key_sequence = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["name"]
        # the REST list's orderings (fleet.api.DeviceQuery), the primary key breaking ties: a
        # page is read off the index instead of sorting the whole fleet
        indexes = [
            models.Index(fields=["organisation", "enrolled_at", "id"], name="device_org_enrolled"),
            models.Index(fields=["organisation", "name", "id"], name="device_org_name"),
        ]

    def __str__(self) -> str:
        return self.name


class DeviceVersionCount(models.Model):
    """Live (unrevoked) devices per organisation and running version (null: none), for a
    release's "on its version / on others" figures without counting the whole fleet.

    Owner: PostgreSQL. Statement-level triggers on fleet_device (migration 0007) move the
    devices a statement changed from count to count (organisation, running version or
    revocation), in the same transaction, whoever writes (a check-in, a bulk revoke, a version
    deleted under devices, raw SQL); nothing in Python writes here. Each count is spread over
    16 ``slot`` rows (by device id) so devices installing the same version at once do not
    queue on one row lock; readers add the slots up. A row can reach 0 and stay. On other
    databases there are no triggers and fleet.selectors counts the devices instead."""

    # plain columns, no foreign keys: the triggers keep rows of deleted organisations and
    # versions at 0 rather than race their cascades
    organisation_id = models.BigIntegerField()
    version_id = models.UUIDField(null=True)
    slot = models.SmallIntegerField(default=0)
    devices = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organisation_id", "version_id", "slot"],
                name="device_version_count_key",
                nulls_distinct=False,
            )
        ]


class DeviceGroup(models.Model):
    """A named set of devices: static (explicit members) or dynamic (a saved filter, so devices
    that enrol later join, also into running releases)."""

    class Kind(models.TextChoices):
        STATIC = "static", "Static"
        DYNAMIC = "dynamic", "Dynamic"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="device_groups")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.STATIC)
    filter = models.TextField(blank=True)  # the deploy/filters language; dynamic groups only
    members = models.ManyToManyField(Device, blank=True, related_name="groups")
    pinned_version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # {"cron", "duration_seconds", "timezone"}: when its devices may activate new versions
    window = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["organisation", "name"], name="unique_group_name")]

    def __str__(self) -> str:
        return self.name


class DeviceVersionChange(models.Model):
    """A device began running another version: the history rollbacks read ("what ran before")."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="version_changes")
    from_version = models.ForeignKey(ModelVersion, on_delete=models.SET_NULL, null=True, related_name="+")
    to_version = models.ForeignKey(ModelVersion, on_delete=models.SET_NULL, null=True, related_name="+")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["device", "to_version"])]


class BulkAction(models.Model):
    """Audit of one bulk device operation (fleet.bulk): who did what to how many, and how."""

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="bulk_actions")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    action = models.CharField(max_length=16)  # pin, unpin, label, revoke
    filter = models.TextField(blank=True)  # the filter language expression, or empty
    device_ids = models.JSONField(default=list, blank=True)  # the ids the caller listed, if any
    version = models.ForeignKey(
        ModelVersion, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    labels = models.JSONField(default=dict, blank=True)
    matched = models.PositiveIntegerField()
    changed = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]
