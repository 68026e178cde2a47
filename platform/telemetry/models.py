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
        indexes = [models.Index(fields=["kind", "timestamp"])]
