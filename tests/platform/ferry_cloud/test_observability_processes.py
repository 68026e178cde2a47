"""Metrics, health and logs of real processes: gunicorn with two workers (multiprocess metrics),
a Celery worker (the request id reaches the task's log line), /readyz of a web process whose
database and broker are down, and the gateway's grpc.health.v1 and Prometheus port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis
import requests
from accounts.services import organisation_ensure, user_ensure_admin
from django.conf import settings
from django.db import connection
from ferry_cloud.device_ca import ensure_device_pki
from ferry_cloud.stack import PKI_FILES, free_port, wait_for_port
from fleet.models import Device
from fleet.services import device_enrol, device_revoke, enrolment_token_create
from gateway.checkin_fast import STALE_SECONDS
from gateway.health import _probe_credentials
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.outbox import OutboxRecord
from deploy.proto import agent_pb2
from tests.platform.conftest import onnx_bytes
from tests.platform.ferry_cloud.test_observability import sample, samples
from tests.platform.gateway.devices import Served, enrol

ROOT = Path(__file__).resolve().parents[3]
# a Redis database of these tests' own: other suites' workers must not take our tasks
BROKER = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/12"
GATEWAY_SERVICE = "ferry.agent.v1.AgentGateway"

pytestmark = pytest.mark.slow


class Processes:
    """Child processes with a log file each, stopped (and their logs readable) at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[subprocess.Popen] = []

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            child = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.children.append(child)
        return child

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def json_lines(self, name: str) -> list[dict]:
        lines = []
        for line in self.log(name).splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue  # banners and the like: not log records
        return lines

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path / "logs")
    yield running
    running.stop()


def _until(what: str, check: Callable[[], object], timeout: float = 60.0, processes: Processes | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    logs = ""
    if processes is not None:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in processes.log_dir.glob("*.log"))
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def _env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The suite's settings for a child process, on the test database (committed data only)."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "FERRY_DATA_DIR": str(tmp_path / "data"),
        "FERRY_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": BROKER,
        "FERRY_S3_BUCKET": "",  # local files in the data directory: no shared S3 server to depend on
        "FERRY_LOG_FORMAT": "json",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    ensure_device_pki()  # a gateway child shares the test's dev CA, so the test can enrol and probe
    env.update({name: str(getattr(settings, name)) for name in PKI_FILES})
    env.update(overrides)
    return env


def _gunicorn(processes: Processes, env: dict[str, str], workers: int) -> int:
    port = free_port()
    args = [sys.executable, "-m", "gunicorn", "-c", "platform/ferry_cloud/gunicorn_conf.py"]
    child = processes.spawn(
        "web", args, {**env, "FERRY_WEB_BIND": f"127.0.0.1:{port}", "FERRY_WEB_WORKERS": str(workers)}
    )
    wait_for_port(port, 60, process=child)
    return port


def test_web_and_worker_request_ids_json_lines_and_multiprocess_metrics(
    transactional_db, tmp_path, processes
):
    org = organisation_ensure(name="Observed")
    _, token = user_ensure_admin(organisation=org, username="observer", password="never-logged-pw")
    for i in range(3):
        device_enrol(
            token=enrolment_token_create(organisation=org).token, name=f"d{i}", attributes={}, labels={}
        )
    redis.Redis.from_url(BROKER).flushdb()
    env = _env(tmp_path, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"))
    port = _gunicorn(processes, env, workers=2)
    worker_env = {k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"}  # web role only
    processes.spawn(
        "worker",
        [sys.executable, "-m", "celery", "-A", "ferry_cloud", "worker", "--pool", "solo"],
        worker_env,
    )
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Token {token}"}

    # an upload enqueues the conversion: its request id must reach the worker's task line
    model = requests.post(f"{base}/api/v1/models/", json={"name": "m"}, headers=auth, timeout=30).json()
    request_id = "upload-0123456789"
    upload = requests.post(
        f"{base}/api/v1/models/{model['id']}/versions/",
        files={"file": ("model.onnx", onnx_bytes())},
        data={"label": "v1"},
        headers={**auth, "X-Request-ID": request_id},
        timeout=60,
    )
    assert upload.status_code == 201, upload.text
    assert upload.headers["X-Request-ID"] == request_id

    def task_line() -> dict | None:
        lines = processes.json_lines("worker")
        return next(
            (x for x in lines if x.get("event") == "task" and x.get("request_id") == request_id), None
        )

    task = _until("the conversion task's log line", task_line, 120, processes)
    assert task["task"] == "registry.tasks.convert_version"
    assert task["state"] == "SUCCESS" and isinstance(task["duration_ms"], float) and task["task_id"]
    web_lines = processes.json_lines("web")
    line = next(x for x in web_lines if x.get("event") == "request" and x.get("request_id") == request_id)
    assert (line["method"], line["path"], line["view"], line["status"]) == (
        "POST",
        f"/api/v1/models/{model['id']}/versions/",
        "api:model-versions",
        201,
    )
    assert line["user_id"] and line["organisation_id"] == org.pk and line["duration_ms"] > 0

    # every worker's counts summed, the domain figures once, whichever worker serves the scrape
    for _ in range(20):
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
    for _ in range(3):
        text = requests.get(f"{base}/metrics", timeout=30).text
        found = samples(text)
        by_view = "django_http_responses_total_by_status_view_method_total"
        assert sample(found, by_view, method="GET", status="200", view="healthz") == 20
        assert sample(found, "ferry_devices", state="online") == 3
        assert text.count('ferry_devices{state="online"}') == 1
        assert sample(found, "ferry_devices_by_version", organisation=org.slug, model="", version="") == 3
    ready = requests.get(f"{base}/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    assert "never-logged-pw" not in processes.log("web") and token not in processes.log("web")


def test_readyz_names_the_database_and_broker_when_they_are_down(tmp_path, processes):
    closed_db, closed_broker = free_port(), free_port()
    env = _env(
        tmp_path,
        FERRY_DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed_db}/ferry",
        REDIS_URL=f"redis://127.0.0.1:{closed_broker}/0",
    )
    port = _gunicorn(processes, env, workers=1)
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200  # no database
    response = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=60)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["failing"] == ["database", "broker"]
    assert body["checks"]["storage"]["ok"] is True
    assert body["checks"]["database"]["error"] and body["checks"]["broker"]["error"]


def _health(address: str, service: str = "") -> int:
    credentials, name = _probe_credentials()  # the gateway serves mutual TLS only
    with grpc.secure_channel(
        address, credentials, options=[("grpc.ssl_target_name_override", name)]
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def test_gateway_health_metrics_and_rpc_lines(transactional_db, tmp_path, processes, monkeypatch):
    org = organisation_ensure(name="Gatewayed")
    token = enrolment_token_create(organisation=org).token
    port, metrics_port, enrol_port = free_port(), free_port(), free_port()
    env = _env(tmp_path, FERRY_GATEWAY_ENROL_ADDRESS=f"127.0.0.1:{enrol_port}")
    args = [sys.executable, "manage.py", "gateway", "--address", f"127.0.0.1:{port}"]
    child = processes.spawn("gateway", [*args, "--metrics-port", str(metrics_port)], env)
    wait_for_port(port, 60, process=child)
    address = f"127.0.0.1:{port}"
    serving = health_pb2.HealthCheckResponse.SERVING
    _until("SERVING", lambda: _health(address) == serving, 60, processes)
    assert _health(address, GATEWAY_SERVICE) == serving
    probe = [sys.executable, "-m", "gateway.health", address]
    assert subprocess.run(probe, cwd=ROOT, env=env, timeout=60).returncode == 0  # the container probe
    with pytest.raises(grpc.RpcError) as unknown:
        _health(address, "no.such.Service")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

    attrs = agent_pb2.DeviceAttributes(hardware="pi4", os="linux", agent_version="test")
    client, reply = enrol(Served(address, f"127.0.0.1:{enrol_port}"), org, name="observed", token=token)
    client_key = reply.key_pem
    assert not client.check_in(attrs, "", "").HasField("desired")
    records = [OutboxRecord(seq, "metrics", 1.7e9 + seq, "", {"inferences": seq}) for seq in (1, 2)]
    client.report(records)
    client.report(records)  # replayed: both duplicates
    with monkeypatch.context() as shared:  # the gateway hears of revocations through its Redis
        shared.setenv("REDIS_URL", BROKER)
        device_revoke(device=Device.objects.get(pk=reply.device_id))
    # another process: it answers no-change check-ins from memory, and hears of revocations
    # within STALE_SECONDS (or stops answering from memory)
    time.sleep(STALE_SECONDS + 0.2)
    with pytest.raises(grpc.RpcError) as refused:
        client.check_in(attrs, "", "")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    Device.objects.filter(pk=reply.device_id).update(revoked_at=None)  # back, for the stream below
    stream = client.watch("", timeout=60)

    def scrape() -> dict[str, float]:
        return samples(requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text)

    _until("an open hint stream", lambda: sample(scrape(), "ferry_gateway_hint_streams_open") == 1, 30)
    found = scrape()
    rpcs = "ferry_gateway_rpcs_total"
    assert sample(found, rpcs, method="AgentGateway/Enrol", code="OK") == 1
    assert sample(found, rpcs, method="AgentGateway/CheckIn", code="OK") == 1
    assert sample(found, rpcs, method="AgentGateway/CheckIn", code="PERMISSION_DENIED") == 1
    assert sample(found, rpcs, method="AgentGateway/ReportTelemetry", code="OK") == 2
    assert sample(found, "ferry_gateway_rpc_duration_seconds_count", method="AgentGateway/CheckIn") == 2
    assert sample(found, "ferry_gateway_check_ins_total", offered="no") == 1
    assert sample(found, "ferry_gateway_telemetry_records_total", result="stored") == 2
    assert sample(found, "ferry_gateway_telemetry_records_total", result="duplicate") == 2
    assert sample(found, rpcs, method="Health/Check", code="OK") >= 2
    stream.cancel()
    _until("the stream closed", lambda: sample(scrape(), "ferry_gateway_hint_streams_open") == 0, 30)

    lines = processes.json_lines("gateway")
    check_ins = [x for x in lines if x.get("event") == "rpc" and x.get("method") == "AgentGateway/CheckIn"]
    assert [(x["code"], x["device_id"]) for x in check_ins] == [
        ("OK", reply.device_id),
        ("PERMISSION_DENIED", reply.device_id),
    ]
    assert all(isinstance(x["duration_ms"], float) and x["request_id"] for x in check_ins)
    log = processes.log("gateway")
    key_line = client_key.splitlines()[1].decode()  # a line of the device key's base64 body
    assert key_line not in log and token not in log


def test_gateway_is_not_serving_without_its_database(tmp_path, processes):
    env = _env(tmp_path, FERRY_DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/ferry")
    port = free_port()
    child = processes.spawn(
        "gateway", [sys.executable, "manage.py", "gateway", "--address", f"127.0.0.1:{port}"], env
    )
    wait_for_port(port, 60, process=child)
    address = f"127.0.0.1:{port}"
    _until(
        "a 'not serving' log line", lambda: "gateway not serving" in processes.log("gateway"), 60, processes
    )
    assert _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert _health(address, GATEWAY_SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING
    probe = [sys.executable, "-m", "gateway.health", address]
    assert subprocess.run(probe, cwd=ROOT, env=env, timeout=60).returncode == 1
