"""The telemetry schema over hostile records: each is either refused with a reason or storable."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from telemetry.schema import (
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_PAYLOAD_BYTES,
    BatchRefused,
    RecordRefused,
    check_batch,
    validate_record,
)

NOW = 1.8e9
GOOD_METRICS = {
    "inferences": 120,
    "errors": 0,
    "latency_ms_p50": 1.5,
    "latency_ms_p95": None,
    "latency_ms_histogram": {"le_1": 3},
    "top1_histogram": {"7": 120},
    "cpu_percent": 12.5,
    "version": "42",
    "update_state": "idle",
    "outbox_dropped_total": 0,
}


def _record(**overrides):
    fields = {
        "seq": 1,
        "kind": "metrics",
        "timestamp": NOW - 5,
        "version_id": "42",
        "payload_json": json.dumps(GOOD_METRICS),
        "now": NOW,
    }
    return validate_record(**{**fields, **overrides})


def test_the_agents_records_pass():
    assert _record().payload == GOOD_METRICS
    activation = {"ok": False, "version_id": "42", "reason": "unhealthy", "stage": "health", "from": None}
    assert _record(kind="activation", payload_json=json.dumps(activation)).payload["ok"] is False
    assert _record(kind="event", payload_json=json.dumps({"pipeline": {"score": [0.1, 0.9]}})).kind == "event"
    assert _record(payload_json="").payload == {}  # an empty payload is an empty object


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"payload_json": '{"inferences": "12"}'}, "payload.inferences must be a whole number"),
        ({"payload_json": '{"inferences": -1}'}, "payload.inferences must be between 0"),
        ({"payload_json": '{"inferences": true}'}, "payload.inferences must be a whole number"),
        ({"payload_json": '{"latency_ms_p95": NaN}'}, "NaN"),
        ({"payload_json": '{"latency_ms_p95": Infinity}'}, "Infinity"),
        ({"payload_json": '{"latency_ms_p95": 1e400}'}, "out of range"),
        ({"payload_json": '{"top1_histogram": {"3": "many"}}'}, "payload.top1_histogram bucket '3'"),
        ({"payload_json": '{"top1_histogram": [1, 2]}'}, "must be an object of counts"),
        ({"payload_json": "[1, 2]"}, "must be a JSON object"),
        ({"payload_json": "{not json"}, "not JSON"),
        ({"payload_json": '{"x": "\\u0000"}'}, "NUL"),
        ({"payload_json": '{"x": "\\ud800"}'}, "surrogate"),
        ({"payload_json": json.dumps({"x": "a" * 2000})}, "longer than 1024"),
        ({"payload_json": json.dumps({"x": 2**70})}, "beyond 64 bits"),
        ({"payload_json": "[" * 50 + "]" * 50}, "must be a JSON object"),
        ({"payload_json": '{"a":' * 20 + "1" + "}" * 20}, "nested deeper"),
        ({"payload_json": json.dumps({"x": "a" * MAX_PAYLOAD_BYTES})}, "larger than"),
        ({"kind": "activation", "payload_json": "{}"}, "needs payload.ok"),
        ({"kind": "activation", "payload_json": '{"ok": "yes"}'}, "payload.ok must be true or false"),
        ({"kind": "bogus"}, "kind 'bogus' is not one of"),
        ({"seq": 0}, "seq must be between"),
        ({"seq": 2**63}, "seq must be between"),
        ({"timestamp": math.nan}, "timestamp"),
        ({"timestamp": 1e300}, "timestamp"),
        ({"timestamp": 12.0}, "timestamp"),
        ({"timestamp": NOW + 2 * 86400}, "timestamp"),
        ({"version_id": "../../etc"}, "version_id"),
        ({"version_id": "v\x00"}, "version_id"),
        ({"version_id": "x" * 65}, "version_id"),
    ],
)
def test_bad_records_are_refused_with_a_reason(overrides, reason):
    with pytest.raises(RecordRefused) as refused:
        _record(**overrides)
    assert reason in str(refused.value)


def test_batch_limits_refuse_the_whole_call():
    check_batch(records=MAX_BATCH_RECORDS, message_bytes=MAX_BATCH_BYTES)
    with pytest.raises(BatchRefused, match="at most 1000 records"):
        check_batch(records=MAX_BATCH_RECORDS + 1, message_bytes=10)
    with pytest.raises(BatchRefused, match="bytes"):
        check_batch(records=1, message_bytes=MAX_BATCH_BYTES + 1)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
payloads = st.one_of(
    st.dictionaries(
        st.sampled_from([*GOOD_METRICS, "ok", "counter", "reason", "x"]), json_values, max_size=8
    ),
    json_values,
).map(json.dumps) | st.text(max_size=200)


def _storable(value) -> bool:
    """What readers and PostgreSQL's jsonb need: finite numbers, no NUL, no lone surrogates."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    return True


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    seq=st.integers(min_value=0, max_value=2**64 - 1),
    kind=st.sampled_from(["metrics", "activation", "event"]) | st.text(max_size=20),
    timestamp=st.floats(allow_nan=True, allow_infinity=True) | st.floats(min_value=9e8, max_value=1.81e9),
    version_id=st.sampled_from(["", "42", "v1.2"]) | st.text(max_size=70),
    payload_json=payloads,
)
def test_hostile_records_are_refused_or_storable(seq, kind, timestamp, version_id, payload_json):
    try:
        record = validate_record(
            seq=seq, kind=kind, timestamp=timestamp, version_id=version_id, payload_json=payload_json, now=NOW
        )
    except RecordRefused as refused:
        assert str(refused)  # always a reason
        return
    assert 1 <= record.seq < 2**63 and math.isfinite(record.timestamp)
    assert isinstance(record.payload, dict) and _storable(record.payload)
    assert len(json.dumps(record.payload)) < 4 * len(payload_json) + 10
    for name in ("inferences", "errors", "restarts") if kind == "metrics" else ():
        value = record.payload.get(name)
        assert value is None or (type(value) is int and value >= 0)
    if kind == "activation":
        assert type(record.payload["ok"]) is bool


def test_the_clock_defaults_to_now():
    with pytest.raises(RecordRefused, match="timestamp"):
        validate_record(
            seq=1, kind="event", timestamp=time.time() + 3 * 86400, version_id="", payload_json="{}"
        )
    assert (
        validate_record(seq=1, kind="event", timestamp=time.time(), version_id="", payload_json="{}").seq == 1
    )
