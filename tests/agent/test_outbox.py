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


def test_refused_records_are_dropped_counted_and_only_from_the_batch_in_flight(tmp_path: Path, caplog):
    # a refused record breaks the gateway's schema on every re-send: keeping it would block the outbox
    outbox = Outbox(tmp_path / "o.sqlite")
    for i in range(5):
        outbox.append("metrics", {"i": i})
    assert [r.seq for r in outbox.batch(3)] == [1, 2, 3]
    outbox.acknowledge([1, 3], {2: "payload.i must be a whole number", 5: "not in this batch"})
    assert [r.seq for r in outbox.batch(10)] == [4, 5]  # 5 was not in flight: a reply cannot drop it
    assert outbox.rejected_total() == 1
    assert "telemetry record 2 refused by the gateway and dropped" in caplog.text
    outbox.acknowledge([4, 5], {4: "late refusal of a stored record"})  # already deleted: not counted
    assert outbox.pending() == 0 and outbox.rejected_total() == 1
    outbox.close()
    assert Outbox(tmp_path / "o.sqlite").rejected_total() == 1  # survives a restart


def test_a_batch_stays_under_the_byte_limit_but_always_holds_one_record(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite")
    for i in range(4):
        outbox.append("event", {"blob": "x" * 1000, "i": i})
    assert [r.seq for r in outbox.batch(10, max_bytes=2500)] == [1, 2]
    assert [r.seq for r in outbox.batch(10, max_bytes=10)] == [1]  # a large record still goes, alone
    assert len(outbox.batch(10)) == 4


def test_long_strings_are_clipped_to_what_the_gateway_accepts(tmp_path: Path):
    outbox = Outbox(tmp_path / "o.sqlite")
    outbox.append(
        "activation", {"ok": False, "reason": "incompatible: " + "x" * 5000, "k" * 300: ["y" * 2000]}
    )
    payload = outbox.batch()[0].payload
    assert len(payload["reason"]) == 1024 and payload["reason"].startswith("incompatible: ")
    assert payload["k" * 128] == ["y" * 1023 + "…"]
