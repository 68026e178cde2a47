"""Retention: raw telemetry older than FERRY_TELEMETRY_RAW_DAYS becomes hourly rollups, then goes.

One receipt hour at a time, in one transaction: the hour's raw rows are locked, summed per
(organisation, version) into TelemetryRollup and deleted together, so a crash leaves either
both or neither, and a second run at the same time (two beat processes) finds the rows gone
once the first commits and adds nothing twice. Raw rows can no longer arrive for an hour
that old (received_at is the server's clock), so a rolled-up hour is final.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from telemetry.models import TelemetryRecord, TelemetryRollup
from telemetry.selectors import finite_number

DEFAULT_RAW_DAYS = 14
HOUR = timedelta(hours=1)


@dataclass
class _Sums:
    records: int = 0
    metrics_records: int = 0
    inferences: int = 0
    errors: int = 0
    restarts: int = 0
    activations_ok: int = 0
    activations_failed: int = 0
    events: int = 0
    records_skipped: int = 0
    devices: set = field(default_factory=set)
    latencies: list = field(default_factory=list)


@dataclass(frozen=True)
class RetentionResult:
    hours: int
    rollups: int
    pruned: int


def raw_days() -> int:
    return int(getattr(settings, "FERRY_TELEMETRY_RAW_DAYS", DEFAULT_RAW_DAYS))


def telemetry_roll_up_and_prune(*, now: datetime | None = None, max_hours: int = 72) -> RetentionResult:
    """Roll up and delete raw records received before now - raw days, oldest hour first.

    At most ``max_hours`` hours per run, so a backlog is worked off over several runs
    without one transaction holding the table for long."""
    cutoff = ((now or timezone.now()) - timedelta(days=raw_days())).replace(minute=0, second=0, microsecond=0)
    hours = rollups = pruned = 0
    while hours < max_hours:
        oldest = TelemetryRecord.objects.filter(received_at__lt=cutoff).aggregate(at=Min("received_at"))["at"]
        if oldest is None:
            break
        hour = oldest.replace(minute=0, second=0, microsecond=0)
        made, deleted = _roll_up_hour(hour)
        hours, rollups, pruned = hours + 1, rollups + made, pruned + deleted
    return RetentionResult(hours=hours, rollups=rollups, pruned=pruned)


@transaction.atomic
def _roll_up_hour(hour: datetime) -> tuple[int, int]:
    raw = TelemetryRecord.objects.filter(received_at__gte=hour, received_at__lt=hour + HOUR)
    # FOR UPDATE OF the records only (not the devices joined for the organisation): a concurrent
    # run waits here, then sees these rows deleted
    rows = list(
        raw.select_for_update(of=("self",)).values_list(
            "pk", "device__organisation_id", "device_id", "kind", "version_id", "payload"
        )
    )
    sums: dict[tuple[int, str], _Sums] = defaultdict(_Sums)
    for _, organisation_id, device_id, kind, version_id, payload in rows:
        _add(sums[(organisation_id, version_id)], device_id, kind, payload)
    for (organisation_id, version_id), s in sums.items():
        _store(organisation_id, version_id, hour, s)
    deleted = TelemetryRecord.objects.filter(pk__in=[row[0] for row in rows]).delete()[0]
    return len(sums), deleted


def _add(s: _Sums, device_id, kind: str, payload: object) -> None:
    """One raw record into its sums; stored rows that predate the schema may hold anything."""
    s.records += 1
    s.devices.add(str(device_id))
    if not isinstance(payload, dict):
        s.records_skipped += 1
        return
    if kind == "metrics":
        figures = {name: finite_number(payload.get(name)) for name in ("inferences", "errors", "restarts")}
        if any(v is None and payload.get(name) is not None for name, v in figures.items()):
            s.records_skipped += 1
            return
        s.metrics_records += 1
        s.inferences += int(figures["inferences"] or 0)
        s.errors += int(figures["errors"] or 0)
        s.restarts += int(figures["restarts"] or 0)
        if (latency := finite_number(payload.get("latency_ms_p95"))) is not None:
            s.latencies.append(latency)
    elif kind == "activation":
        if payload.get("ok") is True:
            s.activations_ok += 1
        else:
            s.activations_failed += 1
    else:
        s.events += 1


def _store(organisation_id: int, version_id: str, hour: datetime, s: _Sums) -> None:
    rollup, _ = TelemetryRollup.objects.select_for_update().get_or_create(
        organisation_id=organisation_id, version_id=version_id, hour=hour
    )
    # an hour is normally rolled up once; if it is met again (a clock step), figures add up
    for name in (
        "records",
        "metrics_records",
        "inferences",
        "errors",
        "restarts",
        "activations_ok",
        "activations_failed",
        "events",
        "records_skipped",
    ):
        setattr(rollup, name, getattr(rollup, name) + getattr(s, name))
    rollup.devices = max(rollup.devices, len(s.devices))
    if s.latencies:
        rollup.latency_ms_p95_median = median(s.latencies)
    rollup.save()
