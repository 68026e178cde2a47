"""Telemetry that survives being offline: a real agent process against the real gateway and
database; the control plane goes down, the agent buffers (and is even SIGKILLed), the control
plane comes back, and every record in the outbox's bound arrives exactly once."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from accounts.services import organisation_ensure
from ferry_cloud.stack import free_port
from fleet.services import enrolment_token_create
from gateway.hints import HintHub
from gateway.server import build_server
from telemetry.models import TelemetryRecord

from tests.agent.double import AgentProcess, wait_for
from tests.e2e.helpers import enrolment_bundle_for

pytestmark = pytest.mark.slow

BOUND = 25


def _outbox(state_dir: Path) -> tuple[int, int]:
    """(last sequence number written, records still waiting) read from the agent's own file."""
    db = sqlite3.connect(state_dir / "outbox.sqlite", timeout=10)
    try:
        last = db.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()[0] - 1
        pending = db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        return last, pending
    finally:
        db.close()


def _serve(port: int, enrol_port: int):
    hub = HintHub(poll_seconds=0.5)
    server, _ = build_server(f"127.0.0.1:{port}", workers=4, hub=hub, enrol_address=f"127.0.0.1:{enrol_port}")
    server.start()
    return server, hub


def test_offline_telemetry_arrives_exactly_once(transactional_db, tmp_path: Path):
    org = organisation_ensure(name="Offline")
    token = enrolment_token_create(organisation=org).token
    port, enrol_port = free_port(), free_port()
    server, hub = _serve(port, enrol_port)
    state_dir = tmp_path / "agent"
    args = ["--metrics-interval", "0.1", "--upload-interval", "0.2", "--outbox-max-records", str(BOUND)]
    agent = AgentProcess(
        state_dir, port, extra=args, bundle_text=enrolment_bundle_for(token, port, enrol_port)
    )
    try:
        device_id = wait_for(lambda: _device_id(state_dir), 30, "enrolment", agent)
        wait_for(
            lambda: TelemetryRecord.objects.filter(device_id=device_id).count() >= 3, 30, "online records"
        )

        server.stop(grace=None)  # the control plane goes away
        hub.stop()
        wait_for(lambda: _outbox(state_dir)[1] >= 10, 30, "records buffered while offline", agent)
        agent.kill()  # and the device loses power while offline
        agent = AgentProcess(state_dir, port, extra=args, token="")
        wait_for(lambda: _outbox(state_dir)[0] >= 3 * BOUND, 60, "more records than the bound", agent)
        server, hub = _serve(port, enrol_port)  # back
        wait_for(lambda: _outbox(state_dir)[1] == 0, 60, "the outbox drained", agent)
        assert agent.stop() == 0
        last, pending = _outbox(state_dir)
        assert pending == 0
        stored = TelemetryRecord.objects.filter(device_id=device_id)
        seqs = list(stored.values_list("seq", flat=True))
        assert len(seqs) == len(set(seqs)), "a record was stored twice"
        dropped = max(int(r.payload.get("outbox_dropped_total", 0)) for r in stored.filter(kind="metrics"))
        assert dropped > 0, "the bound was exceeded, so drops must have been reported"
        assert len(seqs) + dropped == last, (len(seqs), dropped, last)  # every record kept in the bound
        assert set(seqs) <= set(range(1, last + 1))
        kept_after_outage = [s for s in seqs if s > max(seqs) - BOUND]
        assert kept_after_outage == sorted(kept_after_outage)
    finally:
        if agent.process.poll() is None:
            agent.kill()
        server.stop(grace=None)
        hub.stop()


def _device_id(state_dir: Path) -> str:
    try:
        return json.loads((state_dir / "credential.json").read_text())["device_id"]
    except FileNotFoundError:
        return ""
