"""No secret in any log: a real end-to-end flow (web, gateway, Celery worker and beat, an agent),
every control-plane process logging at DEBUG, then every process's log is searched for the
secrets the flow used: the admin's password (a console login, and a failed one), the API token,
the enrolment token, the device credential from the agent's state directory and Django's
secret key.  Any of them in any log fails the test."""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

import pytest
import redis
import requests
from ferry_cloud.stack import RestClient, Stack, free_port

from converter.samples import build_image_classifier
from tests.e2e.helpers import bootstrap_admin, own_database, wait_until

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"fleet": "secrets"}

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture
def environment(tmp_path: Path):
    """A database and a Redis database of this test's own, local file storage, verbose logs."""
    broker = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/11"
    redis.Redis.from_url(broker).flushdb()
    with own_database("ferry_secrets") as database_url:
        yield {
            "FERRY_DATA_DIR": str(tmp_path / "data"),
            "FERRY_DATABASE_URL": database_url,
            "REDIS_URL": broker,
            "FERRY_S3_BUCKET": "",
            "FERRY_CHECKIN_INTERVAL_SECONDS": "2",
            "FERRY_RELEASE_KEY_FILE": str(tmp_path / "data" / "release.key"),
            "FERRY_LOG_FORMAT": "json",
            "FERRY_LOG_LEVEL": "DEBUG",
            "ADMIN_PASSWORD": "pw-" + secrets.token_urlsafe(18),
        }


def _console_login(base: str, username: str, password: str) -> int:
    """A browser's login: the form's CSRF token, then the POST; returns the status of the POST."""
    session = requests.Session()
    page = session.get(f"{base}/login/", timeout=30).text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = session.post(
        f"{base}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": csrf},
        headers={"Referer": f"{base}/login/"},
        allow_redirects=False,
        timeout=30,
    )
    return response.status_code


def test_no_secret_appears_in_any_process_log(environment, tmp_path: Path):
    env = {**os.environ, **environment}
    password = environment["ADMIN_PASSWORD"]
    api_token = bootstrap_admin(env, "Secrets E2E", password)
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port = free_port(), free_port()
    state_dir = tmp_path / "agent-0"
    try:
        stack.start_control_plane(http_port, gateway_port)
        base = f"http://127.0.0.1:{http_port}"
        assert _console_login(base, "admin", password + "-wrong") == 200  # the form again, with an error
        assert _console_login(base, "admin", password) == 302
        assert (
            requests.get(
                f"{base}/api/v1/models/", headers={"Authorization": "Token nope"}, timeout=30
            ).status_code
            == 401
        )

        api = RestClient(base, api_token)
        model = api.call("POST", "models/", json={"name": "classifier"})
        files = {"file": ("model.onnx", build_image_classifier().SerializeToString())}
        version = api.call("POST", f"models/{model['id']}/versions/", files=files, data={"label": "v1"})["id"]
        wait_until(
            "the conversion",
            lambda: api.call("GET", f"versions/{version}/")["status"] == "ready",
            stack,
            timeout=90,
        )
        api.call(
            "POST",
            "releases/",
            json={
                "name": "v1",
                "version": version,
                "target": {"labels": LABELS},
                "start": True,
                "allow_empty": True,  # the agent enrols next
            },
        )
        enrolment_token = api.call("POST", "enrolment-tokens/", json={"labels": LABELS})["token"]
        stack.start_agent(
            "agent-0",
            gateway_port,
            state_dir,
            enrolment_token,
            {},
            extra=["--metrics-interval", "1", "--upload-interval", "1"],
        )

        def running_v1() -> bool:
            devices = api.call("GET", "devices/")["results"]
            return len(devices) == 1 and (devices[0]["running_version_info"] or {}).get("label") == "v1"

        wait_until("the agent on v1", running_v1, stack, timeout=90)
        wait_until("telemetry", lambda: api.call("GET", "fleet/summary/"), stack, timeout=90)
        time.sleep(3)  # a few more check-ins, uploads and task runs in the logs
    finally:
        stack.stop()

    device_key = (state_dir / "device.pem").read_text().split("-----BEGIN CERTIFICATE-----")[0]
    ca_key = (tmp_path / "data" / "pki" / "ca.key").read_text()
    django_secret = (tmp_path / "data" / "secret_key").read_text().strip()
    secrets_used = {
        "admin password": password,
        "API token": api_token,
        "enrolment token": enrolment_token,
        "device private key": device_key.splitlines()[1],  # a line of its base64 body
        "device CA private key": ca_key.splitlines()[1],
        "Django secret key": django_secret,
    }
    logs = {p.name: p.read_text(errors="replace") for p in sorted(stack.log_dir.glob("*.log"))}
    assert set(logs) >= {"web.log", "gateway.log", "worker.log", "beat.log", "agent-0.log"}
    # the logs did record the flow (an empty log would pass the search trivially)
    assert '"event": "request"' in logs["web.log"] and '"view": "console:login"' in logs["web.log"]
    assert '"event": "rpc"' in logs["gateway.log"] and "AgentGateway/Enrol" in logs["gateway.log"]
    assert '"event": "task"' in logs["worker.log"]
    found = [
        f"{what} in {name}"
        for name, text in logs.items()
        for what, secret in secrets_used.items()
        if secret in text
    ]
    assert not found, found
