"""Writes: storing telemetry exactly once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from fleet.models import Device

from telemetry.models import TelemetryRecord


@dataclass(frozen=True)
class IncomingRecord:
    seq: int
    kind: str
    timestamp: float
    version_id: str
    payload: dict


@dataclass(frozen=True)
class IngestResult:
    stored: list[int]
    duplicates: list[int]


@transaction.atomic
def telemetry_ingest(*, device: Device, records: list[IncomingRecord]) -> IngestResult:
    """Store new records, skip ones already stored; both kinds are acknowledged to the device."""
    seqs = {r.seq for r in records}
    existing = set(TelemetryRecord.objects.filter(device=device, seq__in=seqs).values_list("seq", flat=True))
    fresh = {r.seq: r for r in records if r.seq not in existing}  # a batch may repeat a seq
    TelemetryRecord.objects.bulk_create(
        [
            TelemetryRecord(
                device=device,
                seq=r.seq,
                kind=r.kind,
                timestamp=datetime.fromtimestamp(r.timestamp, tz=UTC),
                version_id=r.version_id,
                payload=r.payload,
            )
            for r in fresh.values()
        ],
        ignore_conflicts=True,  # a concurrent retry of the same batch: the constraint keeps one
    )
    return IngestResult(stored=sorted(fresh), duplicates=sorted(existing))
