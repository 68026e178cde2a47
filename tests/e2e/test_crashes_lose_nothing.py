"""SIGKILL mid-operation loses nothing: the real gateway killed while a real agent uploads
telemetry, restarted, and every record the agent had seen acknowledged is stored exactly once,
the rest arriving after the restart. The processes share the test's PostgreSQL database."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from accounts.services import organisation_ensure
from django.db import connection
from ferry_cloud.stack import MANAGE, Stack, free_port, wait_for_port
from fleet.services import enrolment_token_create
from telemetry.models import TelemetryRecord

from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.slow


def _database_url() -> str:
    """The test database, for the stack's processes to share with this one."""
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def _outbox(state_dir: Path) -> tuple[int, set[int]]:
    """(last sequence number written, sequence numbers not yet acknowledged) from the agent's file."""
    db = sqlite3.connect(state_dir / "outbox.sqlite", timeout=10)
    try:
        last = db.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()[0] - 1
        return last, {seq for (seq,) in db.execute("SELECT seq FROM records")}
    finally:
        db.close()


def _device_id(state_dir: Path) -> str:
    try:
        return json.loads((state_dir / "credential.json").read_text())["device_id"]
    except FileNotFoundError:
        return ""


def _stored(device_id: str) -> list[int]:
    return list(TelemetryRecord.objects.filter(device_id=device_id).values_list("seq", flat=True))


@pytest.fixture
def stack(transactional_db, tmp_path: Path):
    stack = Stack(
        log_dir=tmp_path / "logs",
        env={
            "FERRY_DATA_DIR": str(tmp_path / "data"),
            "FERRY_DATABASE_URL": _database_url(),
            "FERRY_S3_BUCKET": "",
            "FERRY_LOG_FORMAT": "console",
        },
    )
    stack.prepare_pki()
    stack.enrol_port = free_port()
    stack.env["FERRY_GATEWAY_ENROL_ADDRESS"] = f"127.0.0.1:{stack.enrol_port}"
    try:
        yield stack
    finally:
        stack.stop(timeout=10)


def _start_gateway(stack: Stack, port: int):
    gateway = stack.spawn("gateway", [sys.executable, MANAGE, "gateway", "--address", f"127.0.0.1:{port}"])
    wait_for_port(port, 60, process=gateway)
    wait_for_port(stack.enrol_port, 60, process=gateway)
    return gateway


def _sigkill(stack: Stack, process) -> None:
    process.kill()
    process.wait()
    stack.processes[:] = [(n, p) for n, p in stack.processes if p is not process]


def test_a_gateway_killed_while_an_agent_uploads_loses_no_acknowledged_record(stack, tmp_path: Path):
    org = organisation_ensure(name="Crashes")
    token = enrolment_token_create(organisation=org).token
    port = free_port()
    gateway = _start_gateway(stack, port)
    state_dir = tmp_path / "agent"
    stack.start_agent(
        "agent", port, state_dir, token, {}, extra=["--metrics-interval", "0.05", "--upload-interval", "0.1"]
    )
    device_id = wait_until("enrolment", lambda: _device_id(state_dir), stack)
    wait_until("records stored", lambda: len(_stored(device_id)) >= 20, stack)

    _sigkill(stack, gateway)  # mid-stream: the agent uploads every 0.1 s
    last, pending = _outbox(state_dir)
    acknowledged = set(range(1, last + 1)) - pending
    stored = _stored(device_id)
    assert acknowledged <= set(stored), sorted(acknowledged - set(stored))[:10]
    wait_until("records buffered while the gateway is down", lambda: len(_outbox(state_dir)[1]) >= 5, stack)

    _start_gateway(stack, port)
    written_while_down = _outbox(state_dir)[0]
    everything = set(range(1, written_while_down + 1))
    wait_until("the records kept while down arrive", lambda: everything <= set(_stored(device_id)), stack)
    stack.stop(timeout=10)
    last, pending = _outbox(state_dir)
    seqs = _stored(device_id)
    assert len(seqs) == len(set(seqs)), "a record was stored twice"
    assert set(seqs) | pending == set(range(1, last + 1)), "a record was lost"
