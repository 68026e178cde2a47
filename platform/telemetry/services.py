"""Writes: storing validated telemetry exactly once, fast on PostgreSQL.

PostgreSQL: the batch is COPYed into a per-connection temporary table and moved into the
real table by one INSERT ... ON CONFLICT (device, seq) DO NOTHING RETURNING seq, so the
rows that come back are exactly the ones this call stored; the rest were stored before
(by an earlier send or a concurrent one, which the unique constraint serialises). COPY
avoids psycopg's client-side quoting of every value, which took three quarters of the
time with bulk_create. SQLite (development, tests) keeps the plain ORM path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, transaction
from django.utils import timezone
from fleet.models import Device

from telemetry.models import TelemetryRecord
from telemetry.schema import ValidRecord

IncomingRecord = ValidRecord  # the name callers (and their tests) use for a record to store

_TABLE = TelemetryRecord._meta.db_table
_STAGING = "ferry_telemetry_staging"
# ON COMMIT DELETE ROWS: the staging table is empty at every commit and never bloats
_CREATE_STAGING = f"""
CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} (
    seq bigint NOT NULL, kind text NOT NULL, ts double precision NOT NULL,
    version_id text NOT NULL, payload jsonb NOT NULL
) ON COMMIT DELETE ROWS
"""
_COPY = f"COPY {_STAGING} (seq, kind, ts, version_id, payload) FROM STDIN"
# the DELETE consumes the staged rows, so a second call in the same transaction starts empty
_MOVE = f"""
WITH batch AS (DELETE FROM {_STAGING} RETURNING seq, kind, ts, version_id, payload)
INSERT INTO {_TABLE} (device_id, seq, kind, "timestamp", version_id, payload, received_at)
SELECT %s, seq, kind, to_timestamp(ts), version_id, payload, %s FROM batch
ON CONFLICT (device_id, seq) DO NOTHING
RETURNING seq
"""


@dataclass(frozen=True)
class IngestResult:
    stored: list[int]
    duplicates: list[int]


def telemetry_ingest(*, device: Device, records: list[ValidRecord]) -> IngestResult:
    """Store new records, skip ones already stored; both kinds are acknowledged to the device.

    Returns only after the transaction committed (unless called inside an outer one), so an
    acknowledgement built from the result never names a record that was not stored.
    """
    fresh = {}
    for record in records:
        fresh.setdefault(record.seq, record)  # a batch may repeat a seq: the first one counts
    if not fresh:
        return IngestResult(stored=[], duplicates=[])
    with transaction.atomic():
        if connection.vendor == "postgresql":
            stored = _ingest_by_copy(device, list(fresh.values()))
        else:
            stored = _ingest_by_orm(device, fresh)
    return IngestResult(stored=sorted(stored), duplicates=sorted(set(fresh) - stored))


def _ingest_by_copy(device: Device, records: list[ValidRecord]) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(_CREATE_STAGING)
        with cursor.cursor.copy(_COPY) as copy:
            copy.write(copy_text(records))  # one buffer: psycopg's write_row costs more per row
        cursor.execute(_MOVE, [device.pk, timezone.now()])
        return {seq for (seq,) in cursor.fetchall()}


def copy_text(records: list[ValidRecord]) -> str:
    """The records as the rows of COPY's text format (tab-separated, a line each): the payload
    is the JSON text as received, escaped only where it holds what the format reserves."""
    return "".join(
        [
            f"{r.seq}\t{_escaped(r.kind)}\t{float(r.timestamp)!r}\t{_escaped(r.version_id)}\t"
            f"{_escaped(r.payload_json or json.dumps(r.payload))}\n"
            for r in records
        ]
    )


def _escaped(text: str) -> str:
    """A COPY text field: backslash, tab, newline and carriage return escaped (JSON may hold
    backslashes in its strings and raw tabs and newlines between its tokens)."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def _ingest_by_orm(device: Device, fresh: dict[int, ValidRecord]) -> set[int]:
    existing = set(
        TelemetryRecord.objects.filter(device=device, seq__in=list(fresh)).values_list("seq", flat=True)
    )
    new = [r for seq, r in fresh.items() if seq not in existing]
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
            for r in new
        ],
        ignore_conflicts=True,  # SQLite serialises writers, so nothing else stored these meanwhile
    )
    return {r.seq for r in new}
