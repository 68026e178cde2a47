"""ReportTelemetry through the real gateway: bad records refused one by one with a reason, the
rest stored exactly once, nothing acknowledged that was not stored; the agent drops refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from telemetry.models import TelemetryRecord
from telemetry.schema import MAX_BATCH_RECORDS
from telemetry.selectors import fleet_rates, release_gate_telemetry

from agent.outbox import Outbox
from deploy.proto import agent_pb2
from tests.platform.gateway.test_gateway import _enrolled, gateway  # noqa: F401


def _record(seq: int, payload, kind: str = "metrics", **fields) -> agent_pb2.TelemetryRecord:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return agent_pb2.TelemetryRecord(
        seq=seq, kind=kind, timestamp=fields.pop("timestamp", time.time()), payload_json=text, **fields
    )


def _send(client, records):
    batch = agent_pb2.TelemetryBatch(records=records)
    return client._stub.ReportTelemetry(batch, timeout=10)  # identity: the client certificate


def test_bad_records_are_refused_and_the_rest_stored_once(org, gateway):  # noqa: F811
    client, reply = _enrolled(org, gateway)
    batch = [
        _record(1, {"inferences": 5, "latency_ms_p95": 2.0}, version_id="9"),
        _record(2, "{not json"),
        _record(3, '{"latency_ms_p95": NaN}'),  # acked but never stored, before
        _record(4, {"inferences": "lots"}),  # acked and then crashed summaries, before
        _record(5, {"ok": True}, kind="activation", version_id="9"),
        _record(6, {}, kind="gossip"),
        _record(7, {"inferences": 1}, timestamp=float("inf")),
        _record(8, {"inferences": 2}, version_id="../../x"),
    ]
    ack = _send(client, batch)
    assert list(ack.stored_seqs) == [1, 5] and not ack.duplicate_seqs
    reasons = {r.seq: r.reason for r in ack.rejected}
    assert set(reasons) == {2, 3, 4, 6, 7, 8}
    assert "not JSON" in reasons[2] and "NaN" in reasons[3]
    assert "payload.inferences must be a whole number" in reasons[4]
    assert "kind 'gossip'" in reasons[6] and "timestamp" in reasons[7] and "version_id" in reasons[8]
    stored = TelemetryRecord.objects.filter(device_id=reply.device_id)
    assert sorted(stored.values_list("seq", flat=True)) == [1, 5]

    again = _send(client, batch)  # a replay after a lost ack: same verdicts, nothing stored twice
    assert list(again.duplicate_seqs) == [1, 5] and not again.stored_seqs
    assert {r.seq for r in again.rejected} == set(reasons)
    assert stored.count() == 2

    # the readers see only well-typed figures
    device = stored.first().device
    assert fleet_rates(organisation=org)["latency_ms_p50"] is None
    treated = release_gate_telemetry(organisation_id=org.pk, version_id="9", since=device.enrolled_at).treated
    assert treated.inferences == 5 and treated.activations == 1 and treated.records_skipped == 0


def test_batch_limits_refuse_the_whole_call(org, gateway):  # noqa: F811
    client, reply = _enrolled(org, gateway)
    too_many = [_record(seq, {}) for seq in range(1, MAX_BATCH_RECORDS + 2)]
    with pytest.raises(grpc.RpcError) as refused:
        _send(client, too_many)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 1000 records" in refused.value.details()
    assert not TelemetryRecord.objects.filter(device_id=reply.device_id).exists()


def test_the_agent_drops_refused_records_and_keeps_the_rest(org, gateway, tmp_path: Path):  # noqa: F811
    client, reply = _enrolled(org, gateway)
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.append("metrics", {"inferences": 3})
    outbox.append("metrics", {"inferences": -3})  # a broken agent's figure: can never be stored
    outbox.append("activation", {"ok": True})
    ack = client.report(outbox.batch())
    assert [r.seq for r in ack.rejected] == [2]
    outbox.acknowledge(
        list(ack.stored_seqs) + list(ack.duplicate_seqs), {r.seq: r.reason for r in ack.rejected}
    )
    assert outbox.pending() == 0 and outbox.rejected_total() == 1
    outbox.append("event", {"n": 1})
    assert [r.seq for r in outbox.batch()] == [4]  # the rest goes on as before
    assert sorted(
        TelemetryRecord.objects.filter(device_id=reply.device_id).values_list("seq", flat=True)
    ) == [1, 3]
