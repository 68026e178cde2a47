"""The durable telemetry outbox: sequence numbers, bounds, acknowledgements, restarts."""

from __future__ import annotations

from pathlib import Path

from agent.outbox import Outbox


def test_records_survive_a_restart_and_sequence_continues(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite")
    assert [outbox.append("metrics", {"n": i}) for i in range(3)] == [1, 2, 3]
    outbox.acknowledge([1])
    outbox.close()
    reopened = Outbox(tmp_path / "o.sqlite")
    assert [r.seq for r in reopened.batch()] == [2, 3]
    assert reopened.batch()[0].payload == {"n": 1}
    assert reopened.append("metrics", {}) == 4


def test_bound_drops_oldest_and_counts_the_drop(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite", max_records=5)
    for i in range(8):
        outbox.append("event", {"i": i})
    assert [r.payload["i"] for r in outbox.batch()] == [3, 4, 5, 6, 7]
    assert outbox.take_dropped() == 3
    assert outbox.take_dropped() == 0
    assert outbox.last_seq() == 8
    outbox.append("event", {"i": 8})
    assert outbox.take_dropped() == 1
    assert outbox.dropped_total() == 4  # the running total is never reset


def test_acknowledging_unknown_or_repeated_seqs_is_harmless(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite")
    outbox.append("metrics", {})
    outbox.acknowledge([1, 1, 99])
    outbox.acknowledge([1])
    assert outbox.pending() == 0


def test_outbox_uses_wal_and_full_sync(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite")
    assert outbox._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert outbox._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_batch_in_flight_is_never_dropped(tmp_path: Path):
    # the gateway may already have stored it: dropping it would report as lost a record that arrived
    outbox = Outbox(tmp_path / "o.sqlite", max_records=3)
    for i in range(3):
        outbox.append("event", {"i": i})
    in_flight = [r.seq for r in outbox.batch(2)]
    assert in_flight == [1, 2]
    outbox.append("event", {"i": 3})  # seq 4: over the bound
    assert outbox.take_dropped() == 1  # seq 3, the oldest record not in flight
    outbox.acknowledge(in_flight)
    assert [r.seq for r in outbox.batch(10)] == [4]


def test_a_failed_upload_releases_its_batch_to_the_bound(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite", max_records=2)
    outbox.append("event", {})
    outbox.append("event", {})
    outbox.batch(2)
    outbox.release_in_flight()
    outbox.append("event", {})
    assert outbox.take_dropped() == 1
    assert [r.seq for r in outbox.batch(10)] == [2, 3]
