"""The durable telemetry outbox: SQLite in WAL mode with synchronous=FULL.

Every record gets the next per-device sequence number when it is written, so the
control plane can store each one exactly once however often a batch is re-sent.
The outbox is bounded: past ``max_records`` the oldest are dropped, and the drop
is itself counted and reported in the next record (and as a running total, which
survives the loss of the record that carried an earlier count).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
# half the gateway's 4 MiB message limit (telemetry.schema.MAX_BATCH_BYTES), for protobuf's framing
BATCH_MAX_BYTES = 2 * 1024 * 1024
MAX_STRING_CHARS = 1024  # telemetry.schema's limits, which the agent cannot import
MAX_KEY_CHARS = 128

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    timestamp REAL NOT NULL,
    version_id TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('next_seq', 1), ('dropped', 0), ('dropped_total', 0);
INSERT OR IGNORE INTO meta VALUES ('rejected_total', 0);
"""


def _fit(value: Any) -> Any:
    """Long strings clipped to what the gateway's schema accepts: an activation whose reason
    quotes a long error must still arrive (the schema refuses a string past 1024 characters)."""
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_CHARS else value[: MAX_STRING_CHARS - 1] + "…"
    if isinstance(value, dict):
        return {str(k)[:MAX_KEY_CHARS]: _fit(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_fit(v) for v in value]
    return value


@dataclass(frozen=True)
class OutboxRecord:
    seq: int
    kind: str
    timestamp: float
    version_id: str
    payload: dict[str, Any]


class Outbox:
    def __init__(self, path: Path, *, max_records: int = 100_000) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._max = max_records
        # The batch being uploaded is never dropped: the gateway may already have stored it,
        # and dropping it would count as lost a record that arrived. So while a batch is in
        # flight the outbox may exceed its bound by at most one batch.
        self._in_flight: tuple[int, int] | None = None

    def _meta(self, key: str) -> int:
        return self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0]

    def append(self, kind: str, payload: dict[str, Any], version_id: str = "") -> int:
        """Store one record durably; return its sequence number."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._meta("next_seq")
                self._db.execute("UPDATE meta SET value=? WHERE key='next_seq'", (seq + 1,))
                self._db.execute(
                    "INSERT INTO records VALUES (?, ?, ?, ?, ?)",
                    (seq, kind, time.time(), version_id, json.dumps(_fit(payload), sort_keys=True)),
                )
                self._drop_oldest_over_bound()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return seq

    def _drop_oldest_over_bound(self) -> None:
        excess = self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0] - self._max
        if excess > 0:
            low, high = self._in_flight or (0, -1)
            dropped = self._db.execute(
                "DELETE FROM records WHERE seq IN (SELECT seq FROM records WHERE seq < ? OR seq > ? "
                "ORDER BY seq LIMIT ?)",
                (low, high, excess),
            ).rowcount
            self._db.execute(
                "UPDATE meta SET value=value+? WHERE key IN ('dropped', 'dropped_total')", (dropped,)
            )

    def take_dropped(self) -> int:
        """How many records were dropped since the last call (to report it), resetting the count."""
        with self._lock:
            dropped = self._meta("dropped")
            if dropped:
                self._db.execute("UPDATE meta SET value=0 WHERE key='dropped'")
            return dropped

    def dropped_total(self) -> int:
        """Every record ever dropped: reported with each metrics record, so the figure survives
        even when the record that carried an earlier count is itself dropped."""
        with self._lock:
            return self._meta("dropped_total")

    def batch(self, limit: int = 500, max_bytes: int = BATCH_MAX_BYTES) -> list[OutboxRecord]:
        """The oldest records, marked in flight until acknowledge() or release_in_flight().

        At most ``max_bytes`` of payload (but always one record), so a batch of large records
        stays under the gateway's message limit instead of being refused whole forever."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM records ORDER BY seq LIMIT ?", (limit,)).fetchall()
            size = 0
            for count, row in enumerate(rows):
                size += len(row[4]) + len(row[3]) + len(row[1]) + 32
                if size > max_bytes and count:
                    rows = rows[:count]
                    break
            self._in_flight = (rows[0][0], rows[-1][0]) if rows else None
        return [
            OutboxRecord(seq, kind, ts, version, json.loads(payload))
            for seq, kind, ts, version, payload in rows
        ]

    def acknowledge(self, seqs: list[int], rejected: dict[int, str] | None = None) -> None:
        """Delete the records the gateway stored, and those it refused (seq -> reason).

        A refused record breaks the gateway's schema and would be refused on every re-send,
        so keeping it would only block the outbox; it is logged, counted and dropped. Only
        refusals within the batch in flight are believed: a gateway's reply names that batch.
        """
        with self._lock:
            low, high = self._in_flight or (0, -1)
            self._in_flight = None
            if seqs:
                self._db.executemany("DELETE FROM records WHERE seq=?", [(s,) for s in seqs])
            refused = {seq: reason for seq, reason in (rejected or {}).items() if low <= seq <= high}
            for seq, reason in sorted(refused.items()):
                if self._db.execute("DELETE FROM records WHERE seq=?", (seq,)).rowcount:
                    log.warning("telemetry record %d refused by the gateway and dropped: %r", seq, reason)
                    self._db.execute("UPDATE meta SET value=value+1 WHERE key='rejected_total'")

    def rejected_total(self) -> int:
        """Every record the gateway ever refused (reported with each metrics record)."""
        with self._lock:
            return self._meta("rejected_total")

    def release_in_flight(self) -> None:
        """The upload failed: the batch may be dropped again if the bound needs it."""
        with self._lock:
            self._in_flight = None

    def pending(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]

    def last_seq(self) -> int:
        with self._lock:
            return self._meta("next_seq") - 1

    def close(self) -> None:
        with self._lock:
            self._db.close()
