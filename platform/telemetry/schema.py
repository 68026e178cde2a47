"""What a telemetry record may hold: checked at the gateway, before anything is stored.

Pure Python (no Django), so it can be tested over hostile input on its own. A record that
fails is refused with a reason and never stored; it can never become valid on a re-send,
so the agent drops it. Every stored payload is finite, bounded JSON that PostgreSQL's
jsonb accepts (no NUL, no lone surrogates) and whose known figures have the types the
readers (summaries, gates, dashboards) expect.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ferry_cloud.errors import Invalid

MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 4 * 1024 * 1024  # gRPC's default receive limit: one batch message
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_STRING_CHARS = 1024
MAX_KEY_CHARS = 128
MAX_DEPTH = 6
MAX_SEQ = 2**63 - 1  # the table's BIGINT
MAX_COUNT = 2**53  # integers every JSON reader (JavaScript included) reads exactly
MAX_INTEGER = 2**63 - 1
EARLIEST_TIMESTAMP = 946_684_800.0  # 2000-01-01: a device clock before this was never set
FUTURE_SLACK_SECONDS = 24 * 3600
VERSION_ID = re.compile(r"[A-Za-z0-9._:-]{0,64}")
# what PostgreSQL's text and jsonb refuse: NUL, and UTF-16 surrogates (not valid UTF-8)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class RecordRefused(ValueError):
    """One record breaks the schema; the message says which field and why."""


class BatchRefused(Invalid):
    """The batch as a whole breaks a limit: the call is refused and nothing is stored."""


@dataclass(frozen=True)
class ValidRecord:
    seq: int
    kind: str
    timestamp: float
    version_id: str
    payload: dict[str, Any]
    # the payload as received: stored verbatim (PostgreSQL parses it to the same value), which
    # saves serialising it again; empty when the record was built in Python
    payload_json: str = field(default="", repr=False, compare=False)


# --- field checks: each returns None when the value fits, else the reason ---------------
# (type() is, not isinstance: bool is an int subclass and must not pass as a count; and
# these run for every figure of every record, so the common case returns first)
def _count(value: Any) -> str | None:
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return None
    return "must be a whole number" if type(value) is not int else f"must be between 0 and {MAX_COUNT}"


def _amount(value: Any) -> str | None:
    kind = type(value)
    if (kind is float or kind is int) and 0 <= value <= 1e15:
        return None
    return "must be a number" if kind is not float and kind is not int else "must be between 0 and 1e15"


def _optional_amount(value: Any) -> str | None:
    return None if value is None else _amount(value)


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _optional_count(value: Any) -> str | None:
    return None if value is None else _count(value)


def _histogram(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "must be an object of counts"
    if len(value) > 256:
        return "has more than 256 buckets"
    for bucket, count in value.items():
        if type(count) is not int or not 0 <= count <= MAX_COUNT:
            return f"bucket {bucket[:40]!r} {_count(count)}"
    return None


_METRICS: dict[str, Callable[[Any], str | None]] = {
    **{
        name: _count
        for name in (
            "inferences",
            "errors",
            "restarts",
            "restarts_total",
            "activations_ok",
            "activations_failed",
            "outbox_pending",
            "outbox_dropped",
            "outbox_dropped_total",
            "outbox_rejected_total",
            "rss_bytes",
            "disk_free_bytes",
            # the active LLM package's chat API (agent/llm_api/service.py)
            "llm_requests",
            "llm_errors",
            "llm_prompt_tokens",
            "llm_tokens_generated",
        )
    },
    "llm_ttft_ms_p50": _optional_amount,
    "llm_prefill_tokens_per_second": _optional_amount,
    "llm_decode_tokens_per_second": _optional_amount,
    "cpu_percent": _amount,
    "cpu_seconds_total": _amount,
    "latency_ms_p50": _optional_amount,
    "latency_ms_p95": _optional_amount,
    "latency_ms_histogram": _histogram,
    "top1_histogram": _histogram,
    "version": _text,
    "update_state": _text,
}
_ACTIVATION: dict[str, Callable[[Any], str | None]] = {
    "ok": _flag,
    "version_id": _optional_text,
    "from": _optional_text,
    "reason": _optional_text,
    "stage": _optional_text,
    "counter": _optional_count,
    "refused": _flag,
    "rolled_back_to": _optional_text,
}
# kind -> (known fields and their checks, fields that must be present); other fields are
# allowed (newer agents add figures) but bounded like the rest of the payload
KINDS: dict[str, tuple[dict[str, Callable[[Any], str | None]], tuple[str, ...]]] = {
    "metrics": (_METRICS, ()),
    "activation": (_ACTIVATION, ("ok",)),
    "event": ({}, ()),
}


# --- the payload as bounded, storable JSON ---------------------------------------------
def _refuse_constant(name: str) -> float:
    raise RecordRefused(f"payload_json holds {name}; numbers must be finite")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_payload(payload_json: str) -> dict[str, Any]:
    """The payload as a JSON object of finite numbers, or RecordRefused."""
    if len(payload_json) > MAX_PAYLOAD_BYTES or len(payload_json.encode()) > MAX_PAYLOAD_BYTES:
        raise RecordRefused(f"payload_json is larger than {MAX_PAYLOAD_BYTES} bytes")
    try:
        payload = _DECODER.decode(payload_json or "{}")
    except RecordRefused:
        raise
    except (ValueError, RecursionError) as error:
        raise RecordRefused(f"payload_json is not JSON ({str(error)[:80]})") from None
    if type(payload) is not dict:
        raise RecordRefused("payload_json must be a JSON object")
    # protobuf strings are valid UTF-8, so NUL and surrogates can only come from \u escapes:
    # without one, no string needs the slower check
    _walk(payload, 1, "payload", "\\u" in payload_json)
    return payload


def _walk(container: dict | list, depth: int, where: str, escapes: bool) -> None:
    """Depth, string lengths, finite numbers and storable text, everywhere in the payload.

    Scalars are checked inline (a function call per value would double the cost of a
    typical record). The payload's byte limit bounds how many values there are."""
    if depth > MAX_DEPTH:
        raise RecordRefused(f"{where[:40]} is nested deeper than {MAX_DEPTH} levels")
    items = container.items() if type(container) is dict else ((where, item) for item in container)
    for key, value in items:
        kind = type(value)
        if kind is str:
            if len(value) > MAX_STRING_CHARS:
                raise RecordRefused(f"{key[:40]} is longer than {MAX_STRING_CHARS} characters")
            if escapes and _UNSTORABLE.search(value):
                raise RecordRefused(f"{key[:40]} holds a NUL or an unpaired surrogate")
        elif kind is int:
            if not -MAX_INTEGER <= value <= MAX_INTEGER:
                raise RecordRefused(f"{key[:40]} is an integer beyond 64 bits")
        elif kind is float:
            if not math.isfinite(value):  # 1e400 parses to inf
                raise RecordRefused(f"{key[:40]} is a number out of range")
        elif kind is dict or kind is list:
            _walk(value, depth + 1, key, escapes)
        if len(key) > MAX_KEY_CHARS or (escapes and _UNSTORABLE.search(key)):
            raise RecordRefused(f"{where[:40]} has a key longer than {MAX_KEY_CHARS} or unstorable")


# --- one record -------------------------------------------------------------------------
def validate_record(
    *, seq: int, kind: str, timestamp: float, version_id: str, payload_json: str, now: float | None = None
) -> ValidRecord:
    """The record if it fits its kind's schema, else RecordRefused with the reason."""
    if not 1 <= seq <= MAX_SEQ:
        raise RecordRefused(f"seq must be between 1 and {MAX_SEQ}")
    known = KINDS.get(kind)
    if known is None:
        raise RecordRefused(f"kind {kind[:40]!r} is not one of {', '.join(sorted(KINDS))}")
    now = time.time() if now is None else now
    if not math.isfinite(timestamp) or not EARLIEST_TIMESTAMP <= timestamp <= now + FUTURE_SLACK_SECONDS:
        raise RecordRefused("timestamp must be seconds since the epoch, after 2000 and not in the future")
    if version_id not in _GOOD_VERSION_IDS:
        _check_version_id(version_id)
    payload = parse_payload(payload_json)
    fields, required = known
    for name in required:
        if name not in payload:
            raise RecordRefused(f"a {kind} record needs payload.{name}")
    # the payload's own fields against the known ones (fewer than the known ones, as a rule)
    for name, value in payload.items():
        check = fields.get(name)
        if check is not None and (reason := check(value)) is not None:
            raise RecordRefused(f"payload.{name} {reason}")
    return ValidRecord(seq, kind, float(timestamp), version_id, payload, payload_json or "{}")


# version ids seen valid: a fleet runs a handful, so a set lookup replaces the regex per record
_GOOD_VERSION_IDS: set[str] = set()
_GOOD_VERSION_IDS_MAX = 10_000


def _check_version_id(version_id: str) -> None:
    if not VERSION_ID.fullmatch(version_id):
        raise RecordRefused("version_id must be at most 64 letters, digits or . _ : -")
    if len(_GOOD_VERSION_IDS) >= _GOOD_VERSION_IDS_MAX:
        _GOOD_VERSION_IDS.clear()  # simplest bound: a full set starts over
    _GOOD_VERSION_IDS.add(version_id)


def validate_batch(
    records: Iterable[Any], now: float | None = None
) -> tuple[list[ValidRecord], list[tuple[int, str]]]:
    """Each record (anything with seq, kind, timestamp, version_id and payload_json: the
    protobuf TelemetryRecord as received) validated: (the valid ones, (seq, reason) of the others)."""
    now = time.time() if now is None else now
    valid: list[ValidRecord] = []
    refused: list[tuple[int, str]] = []
    for r in records:
        try:
            valid.append(
                validate_record(
                    seq=r.seq,
                    kind=r.kind,
                    timestamp=r.timestamp,
                    version_id=r.version_id,
                    payload_json=r.payload_json,
                    now=now,
                )
            )
        except RecordRefused as refusal:
            refused.append((r.seq, str(refusal)))
    return valid, refused


def check_batch(*, records: int, message_bytes: int) -> None:
    """Batch-level limits: a violation refuses the whole call (nothing is stored)."""
    if records > MAX_BATCH_RECORDS:
        raise BatchRefused(f"at most {MAX_BATCH_RECORDS} records per batch (got {records})")
    if message_bytes > MAX_BATCH_BYTES:
        raise BatchRefused(f"a batch may be at most {MAX_BATCH_BYTES} bytes (got {message_bytes})")
