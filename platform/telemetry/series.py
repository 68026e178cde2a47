"""Hourly figures of one version against the rest of the fleet, for charts (the canary comparison).

Read from the hourly rollups (telemetry.retention writes them when raw records age out) and,
for the hours still held as raw records, from one SQL aggregate over those records grouped by
receipt hour. Retention deletes the raw records of an hour in the transaction that writes its
rollup, so an hour is counted from one source or the other, never twice. The cost of the
rolled-up part is bounded by hours x versions, whatever the number of devices; the raw part
by the raw records in the window.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from fleet.models import Device

from telemetry.models import TelemetryRecord, TelemetryRollup

HOUR = timedelta(hours=1)
MAX_HOURS = 24 * 31  # a chart wider than a month would need coarser buckets than hours

# One row per (receipt hour, on the version or not) of the raw metrics records in the window.
# A figure that is not a JSON number (stored before the schema checks, or hostile) counts as
# absent, as in the gate and in retention; abs() < 1e300 keeps the float cast in range.
_RAW_SQL = """
SELECT date_trunc('hour', r.received_at) AS hour,
       r.version_id = %(version)s AS mine,
       count(*) AS records,
       count(DISTINCT r.device_id) AS devices,
       coalesce(sum(CASE WHEN jsonb_typeof(r.payload->'inferences') = 'number'
                         AND abs((r.payload->>'inferences')::numeric) < 1e18
                    THEN (r.payload->>'inferences')::numeric END), 0) AS inferences,
       coalesce(sum(CASE WHEN jsonb_typeof(r.payload->'errors') = 'number'
                         AND abs((r.payload->>'errors')::numeric) < 1e18
                    THEN (r.payload->>'errors')::numeric END), 0) AS errors,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY
           CASE WHEN jsonb_typeof(r.payload->'latency_ms_p95') = 'number'
                 AND abs((r.payload->>'latency_ms_p95')::numeric) < 1e300
           THEN (r.payload->>'latency_ms_p95')::float8 END) AS latency
FROM {records} r JOIN {devices} d ON d.id = r.device_id
WHERE d.organisation_id = %(organisation)s AND r.kind = 'metrics' AND r.version_id <> ''
  AND r.received_at >= %(since)s AND r.received_at < %(until)s
GROUP BY 1, 2
"""


@dataclass
class HourFigures:
    """One hour of one cohort: sums, and p95 latency as the median of the records' p95s (a
    weighted mean of those medians when several versions or sources meet in the hour)."""

    records: int = 0
    devices: int = 0
    inferences: int = 0
    errors: int = 0
    _latency_weight: int = 0
    _latency_sum: float = 0.0

    def add(self, *, records: int, devices: int, inferences: int, errors: int, latency: float | None) -> None:
        self.records += records
        self.devices += devices
        self.inferences += inferences
        self.errors += errors
        if latency is not None and records:
            self._latency_weight += records
            self._latency_sum += latency * records

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.inferences if self.inferences else None

    @property
    def latency_ms_p95(self) -> float | None:
        return self._latency_sum / self._latency_weight if self._latency_weight else None


@dataclass
class CanarySeries:
    """Hour by hour, oldest first: the version's devices and the devices on any other version."""

    hours: list[datetime]
    version: list[HourFigures] = field(default_factory=list)
    others: list[HourFigures] = field(default_factory=list)
    rollup_rows: int = 0  # how many rollup rows were read (the bounded part)
    raw_groups: int = 0  # how many (hour, cohort) groups came from raw records


def _hours(since: datetime, until: datetime) -> list[datetime]:
    start = since.replace(minute=0, second=0, microsecond=0)
    hours = []
    while start < until and len(hours) < MAX_HOURS:
        hours.append(start)
        start += HOUR
    return hours


def version_vs_fleet_hourly(
    *, organisation_id: int, version_id: str, since: datetime, until: datetime
) -> CanarySeries:
    """Hourly inferences, errors, reporting devices and p95 latency of ``version_id``'s devices
    and of the rest of the organisation's fleet (devices on another version), since..until.
    Two queries: the rollups, and the raw records' aggregate."""
    hours = _hours(since, until)
    series = CanarySeries(hours=hours)
    if not hours:
        return series
    start, end = hours[0], hours[-1] + HOUR
    buckets: dict[tuple[datetime, bool], HourFigures] = defaultdict(HourFigures)
    rollups = TelemetryRollup.objects.filter(
        organisation_id=organisation_id, hour__gte=start, hour__lt=end
    ).exclude(version_id="")
    for hour, version, records, devices, inferences, errors, latency in rollups.values_list(
        "hour", "version_id", "metrics_records", "devices", "inferences", "errors", "latency_ms_p95_median"
    ):
        series.rollup_rows += 1
        buckets[(hour, version == version_id)].add(
            records=records, devices=devices, inferences=inferences, errors=errors, latency=latency
        )
    sql = _RAW_SQL.format(records=TelemetryRecord._meta.db_table, devices=Device._meta.db_table)
    params = {"version": version_id, "organisation": organisation_id, "since": start, "until": end}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for hour, mine, records, devices, inferences, errors, latency in cursor.fetchall():
            series.raw_groups += 1
            buckets[(hour, mine)].add(
                records=records,
                devices=devices,
                inferences=int(inferences),
                errors=int(errors),
                latency=latency,
            )
    series.version = [buckets.get((h, True)) or HourFigures() for h in hours]
    series.others = [buckets.get((h, False)) or HourFigures() for h in hours]
    return series
