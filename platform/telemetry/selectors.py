"""Reads: the fleet's live figures."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median

from accounts.models import Organisation
from django.db.models import Count, Min
from django.utils import timezone

from deploy.gates import CohortFigures
from telemetry.models import TelemetryRecord


def fleet_rates(*, organisation: Organisation, window_seconds: int = 15) -> dict:
    """Inferences per second and median p50 latency over the metrics received in the last window."""
    since = timezone.now() - timedelta(seconds=window_seconds)
    metrics = TelemetryRecord.objects.filter(
        device__organisation=organisation, kind="metrics", received_at__gte=since
    ).values_list("payload", flat=True)
    # a field that is not a number (a broken or hostile agent) counts as absent, never raises
    payloads = [p for p in metrics if isinstance(p, dict)]
    inferences = sum(int(finite_number(p.get("inferences")) or 0) for p in payloads)
    latencies = [v for p in payloads if (v := finite_number(p.get("latency_ms_p50"))) is not None]
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


_COUNTS = ("inferences", "errors", "restarts")


def finite_number(value: object) -> float | None:
    """The value as a finite number, or None for anything else (bools, strings, NaN, objects)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _well_formed(payload: dict) -> bool:
    """Whether every figure the gate reads is absent or a number (one bad field spoils the record)."""
    for name in (*_COUNTS, "latency_ms_p95"):
        value = payload.get(name)
        if value is not None and finite_number(value) is None:
            return False
    histogram = payload.get("top1_histogram")
    if histogram is None:
        return True
    return isinstance(histogram, dict) and all(finite_number(v) is not None for v in histogram.values())


def _cohort(
    metrics: list[tuple[str, dict]], activations: list[dict], *, selected: int | None = None, skipped: int = 0
) -> CohortFigures:
    """Figures of well-formed records; `selected` (the devices the release chose) gives the pending count."""
    latencies = [float(p["latency_ms_p95"]) for _, p in metrics if p.get("latency_ms_p95") is not None]
    histogram: Counter[str] = Counter()
    for _, payload in metrics:
        histogram.update({str(k): int(v) for k, v in (payload.get("top1_histogram") or {}).items()})
    reporting = len({device for device, _ in metrics})
    return CohortFigures(
        devices_reporting=reporting,
        activations=len(activations),
        activation_failures=sum(1 for p in activations if not p.get("ok", False)),
        inferences=sum(int(p.get("inferences") or 0) for _, p in metrics),
        errors=sum(int(p.get("errors") or 0) for _, p in metrics),
        latency_ms_p95=median(latencies) if latencies else None,
        restarts=sum(int(p.get("restarts") or 0) for _, p in metrics),  # older agents send none
        top1_histogram=dict(histogram),
        devices_pending=max(0, selected - reporting) if selected is not None else 0,
        records_skipped=skipped,
    )


@dataclass(frozen=True)
class GateTelemetry:
    """What a release's gate reads of telemetry, gathered in one pass over the records."""

    treated: CohortFigures
    baseline: CohortFigures
    # {device id: reason code}: see release_gate_telemetry
    failed_activations: dict[str, str] = field(default_factory=dict)


def release_gate_telemetry(
    *,
    organisation_id,
    version_id: str,
    since: datetime,
    device_ids: set[str] | None = None,
    baseline_ids: set[str] | None = None,
    baseline_version_ids: set[str] | None = None,
) -> GateTelemetry:
    """Telemetry received since `since`: the release's devices on version_id, and the baseline.

    With `device_ids` (the devices the release selected) only their records count for the
    release, and selected devices without a metrics record are pending; without it every
    device on version_id counts (the older, organisation-wide reading). The baseline is the
    devices on any other version (the previous version); with `baseline_ids` only theirs (the
    release's own population, so a device pinned elsewhere is no one's yardstick); with
    `baseline_version_ids` only devices on those versions (the ones whose figures measure the
    same thing: a chat's time to first token is no yardstick for a classifier's latency). A record
    whose figures are not numbers is skipped and counted (records_skipped), never raised: one
    device's bad telemetry must not stop the evaluation.

    From the same records, ``failed_activations``:
    the devices of `device_ids` whose latest activation record about version_id (the payload's
    version_id: the record is filed under the version the device runs) is a failure, with its
    reason code (a refusal or a rollback, as telemetry: it may arrive before the check-in that
    carries the same outcome as the device's update status; a later success, a retry that
    worked, clears it). Without `device_ids`, no failures are gathered."""
    records = TelemetryRecord.objects.filter(
        device__organisation_id=organisation_id, received_at__gte=since, kind__in=("metrics", "activation")
    ).values_list("device_id", "kind", "version_id", "payload", "received_at", "pk")
    treated: list[tuple[str, dict]] = []
    baseline: list[tuple[str, dict]] = []
    activations: list[dict] = []
    latest = _LatestActivations(version_id)
    skipped = 0
    for device_id, kind, record_version, payload, received_at, pk in records.iterator(chunk_size=2000):
        device = str(device_id)
        mine = device_ids is None or device in device_ids
        if kind == "activation" and device_ids is not None and mine:
            latest.see(device, payload, (received_at, pk))  # well-formed or not, as a failure reads
        if not isinstance(payload, dict) or not _well_formed(payload):
            skipped += mine and record_version == version_id
            continue
        if kind == "activation":
            if mine and str(payload.get("version_id") or record_version) == version_id:
                activations.append(payload)
        elif record_version == version_id:
            if mine:
                treated.append((device, payload))
        elif (
            record_version
            and (baseline_ids is None or device in baseline_ids)
            and (baseline_version_ids is None or str(record_version) in baseline_version_ids)
        ):
            baseline.append((device, payload))
    selected = None if device_ids is None else len(device_ids)
    return GateTelemetry(
        treated=_cohort(treated, activations, selected=selected, skipped=skipped),
        baseline=_cohort(baseline, []),
        failed_activations=latest.failures(),
    )


class _LatestActivations:
    """Each device's latest activation record about one version, by (received_at, id)."""

    def __init__(self, version_id: str) -> None:
        self._version_id = version_id
        self._latest: dict[str, tuple[tuple, dict]] = {}

    def see(self, device: str, payload: object, order: tuple) -> None:
        if not isinstance(payload, dict) or payload.get("version_id") != self._version_id:
            return
        kept = self._latest.get(device)
        if kept is None or order > kept[0]:
            self._latest[device] = (order, payload)

    def failures(self) -> dict[str, str]:
        return {
            device: str(payload.get("code") or payload.get("stage") or "")
            for device, (_, payload) in self._latest.items()
            if payload.get("ok") is False
        }


def first_report_at(
    *, device_ids: frozenset[str] | set[str], version_id: str, since: datetime
) -> datetime | None:
    """When the first of these devices sent metrics on version_id since `since` (a phase's soak start)."""
    if not device_ids:
        return None
    first = TelemetryRecord.objects.filter(
        device_id__in=device_ids, version_id=version_id, kind="metrics", received_at__gte=since
    ).aggregate(first=Min("received_at"))["first"]
    return first


def telemetry_list(*, device, kind: str | None = None, after=None, before=None):
    """One device's stored records (of one kind if given; sent within the time span if given)."""
    records = TelemetryRecord.objects.filter(device=device)
    if kind is not None:
        records = records.filter(kind=kind)
    if after is not None:
        records = records.filter(timestamp__gte=after)
    if before is not None:
        records = records.filter(timestamp__lt=before)
    return records


def device_recent_records(*, device, limit: int = 20) -> list[dict]:
    """The device's latest records, newest first, with the figures a person reads off them
    (a figure that is not a number shows as absent)."""
    records = TelemetryRecord.objects.filter(device=device).order_by("-seq")[:limit]
    rows = []
    for record in records:
        payload = record.payload if isinstance(record.payload, dict) else {}
        rows.append(
            {
                "seq": record.seq,
                "kind": record.kind,
                "timestamp": record.timestamp,
                "version_id": record.version_id,
                "inferences": finite_number(payload.get("inferences")),
                "errors": finite_number(payload.get("errors")),
                "latency_ms_p50": finite_number(payload.get("latency_ms_p50")),
                "latency_ms_p95": finite_number(payload.get("latency_ms_p95")),
                "detail": _detail(payload),
            }
        )
    return rows


def _detail(payload: dict) -> str:
    """What a non-metrics record says in words (an activation's or a refusal's reason)."""
    return str(payload.get("reason") or payload.get("message") or payload.get("event") or "")[:200]
