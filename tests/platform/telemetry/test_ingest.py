"""Exactly-once storage on PostgreSQL: replays, overlaps, repeats and two processes at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from django.db import connection
from fleet.services import device_enrol, enrolment_token_create
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from telemetry.models import TelemetryRecord
from telemetry.schema import RecordRefused, validate_record
from telemetry.services import IncomingRecord, telemetry_ingest

from tests.platform.telemetry.test_schema import payloads

ROOT = Path(__file__).resolve().parents[3]


def _device(org, name="dev"):
    token = enrolment_token_create(organisation=org).token
    return device_enrol(token=token, name=name, attributes={}, labels={}).device


def _records(seqs, kind="metrics"):
    return [IncomingRecord(s, kind, time.time(), "7", {"inferences": s, "note": "a\tb\\c\n"}) for s in seqs]


def _stored(device) -> list[int]:
    return sorted(TelemetryRecord.objects.filter(device=device).values_list("seq", flat=True))


def test_the_same_batch_twice_is_stored_once(org):
    device = _device(org)
    first = telemetry_ingest(device=device, records=_records(range(1, 101)))
    again = telemetry_ingest(device=device, records=_records(range(1, 101)))
    assert first.stored == list(range(1, 101)) and first.duplicates == []
    assert again.stored == [] and again.duplicates == list(range(1, 101))
    assert _stored(device) == list(range(1, 101))
    record = TelemetryRecord.objects.get(device=device, seq=5)
    # COPY's text format must not mangle tabs, backslashes or newlines in the payload
    assert record.payload == {"inferences": 5, "note": "a\tb\\c\n"}
    assert record.version_id == "7" and record.kind == "metrics"
    assert abs(record.timestamp.timestamp() - time.time()) < 60


def test_overlapping_batches_and_repeats_within_a_batch(org):
    device, other = _device(org), _device(org, "other")
    telemetry_ingest(device=device, records=_records(range(1, 31)))
    overlap = telemetry_ingest(device=device, records=_records([*range(20, 51), 40, 40]))
    assert overlap.stored == list(range(31, 51))
    assert overlap.duplicates == list(range(20, 31))
    # the same seqs from another device are its own records
    assert telemetry_ingest(device=other, records=_records(range(1, 11))).stored == list(range(1, 11))
    assert _stored(device) == list(range(1, 51)) and _stored(other) == list(range(1, 11))
    assert telemetry_ingest(device=device, records=[]).stored == []


def test_two_calls_in_one_transaction_do_not_share_staged_rows(org):
    # the test's own transaction holds both calls: the second must not re-send the first's rows
    device = _device(org)
    telemetry_ingest(device=device, records=_records([1, 2]))
    second = telemetry_ingest(device=device, records=_records([3]))
    assert second.stored == [3] and second.duplicates == []


_WRITER = """
import json, sys, time
import django
django.setup()
from fleet.models import Device
from telemetry.schema import RecordRefused, validate_record
from telemetry.services import IncomingRecord, telemetry_ingest

from tests.platform.telemetry.test_schema import payloads
device = Device.objects.get(pk=sys.argv[1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # both start together
stored = []
for start in range(1, 401, 20):  # overlapping windows of 40 records, like retried batches
    batch = [IncomingRecord(s, "event", time.time(), "", {"s": s}) for s in range(start, start + 40)]
    stored += telemetry_ingest(device=device, records=batch).stored
print(json.dumps(stored))
"""


def test_concurrent_batches_from_two_processes_are_stored_exactly_once(org, transactional_db):
    device = _device(org)
    database = connection.settings_dict["NAME"]
    url = os.environ["FERRY_DATABASE_URL"].rsplit("/", 1)[0] + f"/{database}"
    env = {**os.environ, "FERRY_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "ferry_cloud.settings"}
    start_at = str(time.time() + 5)  # after both have set Django up
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(device.pk), start_at],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=120)[0] for w in writers]
    assert [w.returncode for w in writers] == [0, 0]
    stored = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    # every seq was stored by exactly one of the two, and each is in the table once
    assert sorted(stored[0] + stored[1]) == list(range(1, 421))
    assert _stored(device) == list(range(1, 421))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(texts=st.lists(payloads, min_size=1, max_size=5))
def test_every_record_the_schema_passes_is_stored_as_parsed(org, texts):
    # the payload text is stored verbatim: PostgreSQL must take all of it, and read it back equal
    device = _device(org, name="fuzz") if not hasattr(org, "_fuzz") else org._fuzz
    org._fuzz = device
    first = (TelemetryRecord.objects.filter(device=device).count() + 1) * 10
    valid = []
    for seq, text in enumerate(texts, start=first):
        try:
            valid.append(
                validate_record(
                    seq=seq, kind="event", timestamp=time.time(), version_id="", payload_json=text
                )
            )
        except RecordRefused:
            continue
    result = telemetry_ingest(device=device, records=valid)
    assert result.stored == [r.seq for r in valid]
    for record in valid:
        stored = TelemetryRecord.objects.get(device=device, seq=record.seq).payload
        assert _as_floats(stored) == _as_floats(record.payload)


def _as_floats(value):
    """jsonb keeps numbers as decimals (4.95e16 reads back as an int): compare them as the readers
    do, as floats."""
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def test_what_copy_text_reserves_is_stored_as_sent(org):
    # the COPY rows are built as text: a backslash (JSON's escapes) and raw tabs, newlines and
    # carriage returns (whitespace JSON allows between tokens) must reach PostgreSQL unharmed
    device = _device(org, name="copy-text")
    texts = [
        '{"path": "C:\\\\temp\\\\x", "quote": "say \\"hi\\"", "nl": "a\\nb"}',
        '{\t"a":\n1,\r\n"b"\t:\t[2,\n3]}',
        '{"tab\\tkey": "\\\\t is not a tab", "backslash_n": "\\\\n"}',
    ]
    records = [
        validate_record(
            seq=seq, kind="event", timestamp=time.time(), version_id="v1.2_x:y", payload_json=text
        )
        for seq, text in enumerate(texts, start=1)
    ]
    assert telemetry_ingest(device=device, records=records).stored == [1, 2, 3]
    for record, text in zip(records, texts, strict=True):
        stored = TelemetryRecord.objects.get(device=device, seq=record.seq)
        assert stored.payload == json.loads(text)
        assert stored.version_id == "v1.2_x:y"
