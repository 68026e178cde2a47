"""Reads: the fleet's live figures."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from statistics import median

from accounts.models import Organisation
from django.db.models import Count
from django.utils import timezone

from deploy.gates import CohortFigures
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


def _cohort(metrics: list[tuple[int, dict]], activations: list[dict]) -> CohortFigures:
    latencies = [float(p["latency_ms_p95"]) for _, p in metrics if p.get("latency_ms_p95") is not None]
    histogram: Counter[str] = Counter()
    for _, payload in metrics:
        histogram.update({str(k): int(v) for k, v in (payload.get("top1_histogram") or {}).items()})
    return CohortFigures(
        devices_reporting=len({device for device, _ in metrics}),
        activations=len(activations),
        activation_failures=sum(1 for p in activations if not p.get("ok", False)),
        inferences=sum(int(p.get("inferences") or 0) for _, p in metrics),
        errors=sum(int(p.get("errors") or 0) for _, p in metrics),
        latency_ms_p95=median(latencies) if latencies else None,
        restarts=sum(int(p.get("restarts") or 0) for _, p in metrics),  # older agents send none
        top1_histogram=dict(histogram),
    )


def release_cohort_figures(
    *, organisation_id, version_id: str, since: datetime
) -> tuple[CohortFigures, CohortFigures]:
    """Telemetry received since `since`: the devices running version_id, and the devices on any other version.

    The second cohort is the baseline a health gate compares with (the previous version).
    """
    records = TelemetryRecord.objects.filter(
        device__organisation_id=organisation_id, received_at__gte=since, kind__in=("metrics", "activation")
    ).values_list("device_id", "kind", "version_id", "payload")
    treated: list[tuple[int, dict]] = []
    baseline: list[tuple[int, dict]] = []
    activations: list[dict] = []
    for device_id, kind, record_version, payload in records.iterator(chunk_size=2000):
        payload = payload if isinstance(payload, dict) else {}
        if kind == "activation":
            if str(payload.get("version_id") or record_version) == version_id:
                activations.append(payload)
        elif record_version == version_id:
            treated.append((device_id, payload))
        elif record_version:
            baseline.append((device_id, payload))
    return _cohort(treated, activations), _cohort(baseline, [])
