"""last_seen_at of the check-ins answered from memory, written in batches, not per call.

A check-in answered by gateway.checkin_fast runs no SQL; it only notes here when its device
was seen, if the row's last_seen_at is older than fleet.services.LAST_SEEN_RESOLUTION (the
resolution computed check-ins keep too).  The refresher writes what was noted once a second,
one UPDATE ... FROM (VALUES ...) per thousand devices on PostgreSQL, and never moves a
last_seen_at backwards (a computed check-in may have written a later one meanwhile).
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import Q
from fleet.models import Device

log = logging.getLogger(__name__)
ROWS_PER_STATEMENT = 1000


class LastSeenBatch:
    """device id -> when it was last seen (epoch seconds), until the next flush writes it."""

    def __init__(self) -> None:
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()

    def seen(self, device_id: str, at: float) -> None:
        with self._lock:
            self._pending[device_id] = at

    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> int:
        """Write what was noted; rows written. On a database error the batch is kept for the next flush."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        rows = sorted(batch.items())  # one lock order for every writer: no deadlock between gateways
        try:
            written = _write(rows)
        except Exception as exc:  # the database is briefly away: keep the batch, newest time wins
            log.warning("could not write last_seen_at of %d devices: %s", len(rows), exc)
            with self._lock:
                for device_id, at in rows:
                    self._pending[device_id] = max(at, self._pending.get(device_id, 0.0))
            connection.close()
            return 0
        return written


def _write(rows: list[tuple[str, float]]) -> int:
    if connection.vendor != "postgresql":
        return _write_portable(rows)
    table = Device._meta.db_table
    written = 0
    with connection.cursor() as cursor:
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            values = ", ".join(["(%s::uuid, to_timestamp(%s))"] * len(chunk))
            cursor.execute(
                f'UPDATE "{table}" AS d SET last_seen_at = v.at FROM (VALUES {values}) AS v(id, at) '
                "WHERE d.id = v.id AND (d.last_seen_at IS NULL OR d.last_seen_at < v.at)",
                [x for row in chunk for x in row],
            )
            written += cursor.rowcount
    return written


def _write_portable(rows: list[tuple[str, float]]) -> int:
    """SQLite (the embedded profile): one UPDATE per device, in one transaction."""
    written = 0
    with transaction.atomic():
        for device_id, at in rows:
            when = datetime.fromtimestamp(at, UTC)
            older = Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=when)
            written += Device.objects.filter(older, pk=device_id).update(last_seen_at=when)
    return written
