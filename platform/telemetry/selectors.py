"""Reads: the fleet's live figures."""

from __future__ import annotations

from datetime import timedelta
from statistics import median

from accounts.models import Organisation
from django.db.models import Count
from django.utils import timezone

from telemetry.models import TelemetryRecord


def fleet_rates(*, organisation: Organisation, window_seconds: int = 15) -> dict:
    """Inferences per second and median p50 latency over the metrics received in the last window."""
    since = timezone.now() - timedelta(seconds=window_seconds)
    metrics = TelemetryRecord.objects.filter(
        device__organisation=organisation, kind="metrics", received_at__gte=since
    ).values_list("payload", flat=True)
    inferences = sum(int(p.get("inferences", 0)) for p in metrics)
    latencies = [float(p["latency_ms_p50"]) for p in metrics if p.get("latency_ms_p50") is not None]
    return {
        "window_seconds": window_seconds,
        "inferences_per_second": inferences / window_seconds,
        "latency_ms_p50": median(latencies) if latencies else None,
    }


def record_counts(*, organisation: Organisation) -> dict[str, int]:
    rows = (
        TelemetryRecord.objects.filter(device__organisation=organisation)
        .values("device_id")
        .annotate(n=Count("id"))
    )
    return {str(r["device_id"]): r["n"] for r in rows}
