"""SIGKILL mid-operation loses nothing. The real gateway killed while a real agent uploads
telemetry, restarted: every record the agent had seen acknowledged is stored exactly once, the
rest arrive after the restart. The real web server killed in the middle of a model upload,
restarted: nothing half-stored, and the upload it had accepted before converts. The processes
share the test's PostgreSQL database."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import sys
import time
from pathlib import Path

import pytest
import redis
import requests
from accounts.services import organisation_ensure, user_ensure_admin
from django.db import connection
from ferry_cloud.stack import MANAGE, Stack, free_port, wait_for_port
from fleet.services import enrolment_token_create
from registry.models import Artifact, ModelVersion
from telemetry.models import TelemetryRecord
from urllib3 import encode_multipart_formdata

from converter.samples import build_image_classifier
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


def _start_web(stack: Stack, port: int):
    web = stack.spawn("web", [sys.executable, MANAGE, "runserver", f"127.0.0.1:{port}", "--noreload"])
    wait_for_port(port, 60, process=web)
    return web


def _version_form(label: str, seed: int, num_classes: int = 10) -> tuple[bytes, str]:
    """A multipart body uploading a model version, and its content type."""
    data = build_image_classifier(seed=seed, num_classes=num_classes).SerializeToString()
    return encode_multipart_formdata(
        {"label": label, "file": ("model.onnx", data, "application/octet-stream")}
    )


def _send_half(port: int, path: str, token: str, body: bytes, content_type: str) -> socket.socket:
    """An upload stopped halfway through its body, its connection left open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Token {token}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) // 2])
    return sock


def test_a_web_server_killed_mid_upload_stores_nothing_half_and_converts_what_it_accepted(
    stack, tmp_path: Path
):
    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()  # this test's broker starts empty
    org = organisation_ensure(name="Crashes")
    _, token = user_ensure_admin(organisation=org, username="alice", password="correct horse")
    port = free_port()
    web = _start_web(stack, port)
    rest = requests.Session()
    rest.headers["Authorization"] = f"Token {token}"
    base = f"http://127.0.0.1:{port}/api/v1"
    model = rest.post(f"{base}/models/", json={"name": "classifier"}, timeout=30).json()
    versions = f"{base}/models/{model['id']}/versions/"
    body, content_type = _version_form("v1", seed=1)
    accepted = rest.post(versions, data=body, headers={"Content-Type": content_type}, timeout=30)
    assert accepted.status_code == 201, accepted.text  # accepted; no worker runs yet to convert it

    body, content_type = _version_form("v2", seed=2, num_classes=100_000)  # megabytes
    half = _send_half(port, versions.removeprefix(f"http://127.0.0.1:{port}"), token, body, content_type)
    time.sleep(0.5)  # the server is reading the body by now
    _sigkill(stack, web)  # with half the second upload received
    half.close()

    _start_web(stack, port)
    stack.spawn("worker", [sys.executable, "-m", "celery", "-A", "ferry_cloud", "worker", "--pool", "solo"])
    version_url = f"{base}/versions/{accepted.json()['id']}/"
    ready = wait_until(
        "the accepted upload converted",
        lambda: rest.get(version_url, timeout=30).json()["status"] in ("ready", "failed") or None,
        stack,
        timeout=60,
    )
    assert ready and rest.get(version_url, timeout=30).json()["status"] == "ready"
    assert list(ModelVersion.objects.values_list("label", flat=True)) == ["v1"], "a half upload was stored"
    media = tmp_path / "data" / "media"
    for artifact in Artifact.objects.all():
        assert (media / artifact.file.name).is_file(), f"{artifact.kind} {artifact.pk} has no file"
    assert Artifact.objects.filter(kind=Artifact.Kind.PACKAGE).count() == 1
    stored_files = {str(p.relative_to(media)) for p in media.rglob("*") if p.is_file()}
    assert stored_files == {a.file.name for a in Artifact.objects.all()}, "a file of no artifact was left"
