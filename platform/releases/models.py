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
        COMPLETED = "completed", "Completed"
        ABORTED = "aborted", "Aborted"
        ROLLED_BACK = "rolled_back", "Rolled back"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="releases")
    name = models.CharField(max_length=200)
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="releases")
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT)
    # {"labels": {k: v}, "device_ids": [...], "group_ids": [...], "filter": "...", "percentage": 0..100}
    target = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    # [{"percentage", "min_soak_seconds", "min_reporting_devices", "manual_approval"}], see deploy/phases.py
    phases = models.JSONField(default=list, blank=True)
    current_phase = models.PositiveIntegerField(default=0)
    phase_started_at = models.DateTimeField(null=True, blank=True)
    # the first report of a device this phase selected: the phase's soak clock starts there
    phase_reporting_since = models.DateTimeField(null=True, blank=True)
    # the current phase's highest selected bucket over the matching devices (deploy.rollout.
    # selection_threshold) and the phase it was computed for; null: "bucket < percentage" decides
    bucket_threshold = models.FloatField(null=True, blank=True)
    threshold_phase = models.PositiveIntegerField(null=True, blank=True)
    # devices the target matched when the threshold was last computed (start, advance, gate runs)
    matching_devices = models.PositiveIntegerField(default=0)
    gate = models.JSONField(default=dict, blank=True)  # deploy.gates.GateThresholds fields
    gate_status = models.JSONField(default=dict, blank=True)  # the last evaluation: step, reason, figures
    download_only = models.BooleanField(default=False)
    window = models.JSONField(default=dict, blank=True)  # {"cron", "duration_seconds", "timezone"}
    # bumped by every transition: a caller that sends expected_revision gets a conflict if it moved
    revision = models.PositiveIntegerField(default=0)
    salt = models.CharField(max_length=32, default=_salt, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class ReleaseEvent(models.Model):
    """Audit log: every state change, who made it and why. The organisation's event feed
    (GET /api/v1/audit/, the SSE stream, webhooks) is this table, so an audited change that is
    no release's (a bulk device action, fleet.bulk) is a row here too, with no release."""

    organisation = models.ForeignKey(
        Organisation, on_delete=models.CASCADE, related_name="+", null=True, blank=True
    )  # always set (save() takes the release's); nullable only for the migration that filled it
    release = models.ForeignKey(
        Release, on_delete=models.CASCADE, related_name="events", null=True, blank=True
    )
    action = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    from_phase = models.PositiveIntegerField(null=True, blank=True)
    to_phase = models.PositiveIntegerField(null=True, blank=True)
    # null actor: the periodic health-gate evaluation acted (details holds its figures)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["organisation", "at"], name="release_event_feed")]

    def save(self, *args, **kwargs) -> None:
        if self.organisation_id is None and self.release_id is not None:
            self.organisation_id = self.release.organisation_id  # the create's instance: no query
        super().save(*args, **kwargs)


class DeviceReleaseStatus(models.Model):
    """Where one device stands with one release, as its agent last reported (see releases.device_status)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"  # never stored: a selected device with no report yet
        IDLE = "idle", "Idle"
        DOWNLOADING = "downloading", "Downloading"
        VERIFYING = "verifying", "Verifying"
        STAGED = "staged", "Staged"
        INSTALLED = "installed", "Installed"
        RUNNING = "running", "Running"
        REFUSED = "refused", "Refused"
        FAILED = "failed", "Failed"
        ROLLED_BACK = "rolled_back", "Rolled back"

    release = models.ForeignKey(Release, on_delete=models.CASCADE, related_name="device_statuses")
    device = models.ForeignKey("fleet.Device", on_delete=models.CASCADE, related_name="release_statuses")
    state = models.CharField(max_length=16, choices=State.choices)
    reason_code = models.CharField(max_length=32, blank=True)
    message = models.CharField(max_length=500, blank=True)
    assignment_counter = models.PositiveBigIntegerField(default=0)
    reported_at = models.DateTimeField(null=True, blank=True)  # the device's clock
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["release", "device"], name="one_status_per_release_device")
        ]
        indexes = [models.Index(fields=["release", "state"])]


class DeviceAssignment(models.Model):
    """The signed assignment a device holds now: "run this package" (deploy.trust.assignment).

    One row per device, replaced under a row lock whenever what the device should run changes;
    ``counter`` only goes up.  ``assigned_digests`` lists every package ever assigned to the
    device: the only packages it may download.
    """

    device = models.OneToOneField("fleet.Device", on_delete=models.CASCADE, related_name="assignment")
    counter = models.PositiveBigIntegerField()
    blob = models.BinaryField()  # the canonical JSON the device verifies
    signature = models.BinaryField()
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    release = models.ForeignKey(Release, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    package_digest = models.CharField(max_length=64)
    manifest_sha256 = models.CharField(max_length=64)
    rollback = models.BooleanField(default=False)
    download_only = models.BooleanField(default=False)
    window = models.JSONField(null=True, blank=True)
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    assigned_digests = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"{self.device_id} #{self.counter} -> {self.version_id}"


class ReleaseStateCount(models.Model):
    """Stored reports per release and state, for the detail's by_state without counting every
    report of a large release.

    Owner: PostgreSQL, as fleet.models.DeviceVersionCount: statement-level triggers on
    releases_devicereleasestatus (migration 0007) move the reports a statement changed from
    state to state in the same transaction; nothing in Python writes here. Each count is spread
    over 16 ``slot`` rows (by device id); readers add them up. On other databases there are no
    triggers and releases.selectors counts the reports instead."""

    release_id = models.UUIDField()  # no foreign key: a deleted release's rows stay, at 0
    state = models.CharField(max_length=16)
    slot = models.SmallIntegerField(default=0)
    devices = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["release_id", "state", "slot"], name="release_state_count_key")
        ]
