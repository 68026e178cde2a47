from accounts.models import Organisation
from django.db import models
from fleet.models import Device


class TelemetryRecord(models.Model):
    """One record a device sent; (device, seq) is stored once however often a batch is retried."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="telemetry")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    timestamp = models.DateTimeField()
    version_id = models.CharField(max_length=64, blank=True)
    payload = models.JSONField(default=dict)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "seq"], name="one_record_per_device_seq")]
        indexes = [
            models.Index(fields=["kind", "timestamp"]),
            # one device's records newest first, as the REST list pages them (the key breaks ties)
            models.Index(fields=["device", "received_at", "id"], name="telemetry_device_received"),
        ]


class TelemetryRollup(models.Model):
    """One hour of an organisation's raw telemetry on one version, kept after the raw rows are pruned.

    Written by telemetry.retention when raw records pass FERRY_TELEMETRY_RAW_DAYS; the hour is
    the server's receipt hour (device clocks can be wrong). Figures that were not numbers in the
    raw records are left out and counted in ``records_skipped``."""

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="+")
    version_id = models.CharField(max_length=64, blank=True)
    hour = models.DateTimeField()
    records = models.BigIntegerField(default=0)
    devices = models.IntegerField(default=0)  # distinct devices that reported in the hour
    metrics_records = models.BigIntegerField(default=0)
    inferences = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    restarts = models.BigIntegerField(default=0)
    activations_ok = models.IntegerField(default=0)
    activations_failed = models.IntegerField(default=0)
    events = models.BigIntegerField(default=0)
    latency_ms_p95_median = models.FloatField(null=True, blank=True)
    records_skipped = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organisation", "version_id", "hour"], name="one_rollup_per_version_hour"
            )
        ]
