"""Metrics, health and logs of the web app, in process: /metrics families and labels after real
requests, /healthz without a database, /readyz against the suite's real services, the JSON
request line and the secret redaction."""

from __future__ import annotations

import io
import json
import logging
import re
import time

import pytest
from django.test import Client
from ferry_cloud.observability.logs import formatter
from ferry_cloud.observability.redact import REDACTED, scrub
from fleet.services import device_enrol, enrolment_token_create
from registry.services import model_create, version_upload
from telemetry.services import IncomingRecord, telemetry_ingest

from tests.platform.conftest import onnx_bytes


def samples(text: str) -> dict[str, float]:
    """{'name{label="v",...}': value} with labels in exposition order."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def sample(found: dict[str, float], name: str, **labels: str) -> float | None:
    """The value of the one sample of name whose labels include these (None if none)."""
    for key, value in found.items():
        if key == name or key.startswith(name + "{"):
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', key[len(name) :]))
            if all(pairs.get(k) == v for k, v in labels.items()):
                return value
    return None


def test_healthz_answers_without_a_database_and_returns_a_request_id():
    # no db fixture: pytest-django fails any database access in this test
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert re.fullmatch(r"[0-9a-f]{32}", response["X-Request-ID"])
    echoed = Client().get("/healthz", HTTP_X_REQUEST_ID="req-0123456789")
    assert echoed["X-Request-ID"] == "req-0123456789"
    forged = Client().get("/healthz", HTTP_X_REQUEST_ID='x" level="critical')  # not well formed
    assert forged["X-Request-ID"] != 'x" level="critical'
    assert re.fullmatch(r"[0-9a-f]{32}", forged["X-Request-ID"])


def test_readyz_is_ready_against_the_real_services(db):
    started = time.monotonic()
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok" and body["failing"] == []
    assert set(body["checks"]) == {"database", "broker", "storage"}
    assert all(check["ok"] for check in body["checks"].values())
    assert time.monotonic() - started < 30  # generous: it must only never hang


def test_metrics_after_requests_has_request_database_and_domain_families(org, api):
    # counters are process-wide and other tests in this process add to them: compare deltas
    before = samples(Client().get("/metrics").content.decode())
    assert api.get("/api/v1/models/").status_code == 200
    assert api.get("/api/v1/models/").status_code == 200
    assert api.get("/api/v1/models/999999/").status_code == 404
    model = model_create(organisation=org, name="detector")
    data = onnx_bytes()
    version_upload(model=model, label="v1", stream=io.BytesIO(data), size=len(data))
    token = enrolment_token_create(organisation=org).token
    device = device_enrol(token=token, name="dev", attributes={}, labels={}).device
    refusal = {"ok": False, "version_id": "x", "reason": "bad signature", "stage": "verify", "refused": True}
    telemetry_ingest(device=device, records=[IncomingRecord(1, "activation", time.time(), "", refusal)])

    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())

    def grew(name: str, **labels: str) -> float:
        return (sample(found, name, **labels) or 0) - (sample(before, name, **labels) or 0)

    by_view = "django_http_responses_total_by_status_view_method_total"
    assert grew(by_view, method="GET", status="200", view="api:models") == 2
    assert grew(by_view, method="GET", status="404", view="api:model") == 1
    latency = "django_http_requests_latency_seconds_by_view_method_count"
    assert grew(latency, method="GET", view="api:models") == 2
    assert sample(found, "django_db_execute_total", alias="default", vendor="postgresql") > 0

    assert sample(found, "ferry_devices", state="online") == 1
    assert sample(found, "ferry_devices", state="revoked") == 0
    assert sample(found, "ferry_devices_by_version", organisation=org.slug, model="", version="") == 1
    assert sample(found, "ferry_conversion_jobs", status="queued") == 1
    assert sample(found, "ferry_conversion_jobs", status="failed") == 0
    assert grew("ferry_device_update_failures_total", stage="verify", outcome="refused") == 1
    assert sample(found, "ferry_domain_scrape_errors") == 0
    assert "# TYPE ferry_release_devices gauge" in response.content.decode()


@pytest.fixture
def log_lines():
    """What the root handler's JSON formatter writes, for every record of this test."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json"))
    logging.getLogger().addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logging.getLogger().removeHandler(handler)


def test_one_json_line_per_request_without_headers_or_cookies(api, admin, log_lines):
    api.cookies["sessionid"] = "cookie-value-never-logged"
    response = api.get("/api/v1/models/", HTTP_X_REQUEST_ID="req-json-line-1")
    assert response.status_code == 200
    lines = log_lines()
    requests = [line for line in lines if line.get("event") == "request"]
    assert len(requests) == 1, lines
    line = requests[0]
    assert {k: line[k] for k in ("method", "path", "view", "status", "request_id", "level", "logger")} == {
        "method": "GET",
        "path": "/api/v1/models/",
        "view": "api:models",
        "status": 200,
        "request_id": "req-json-line-1",
        "level": "info",
        "logger": "ferry.request",
    }
    assert line["user_id"] == admin[0].pk and line["organisation_id"] > 0
    assert isinstance(line["duration_ms"], float) and "timestamp" in line
    text = json.dumps(lines)
    assert admin[1] not in text and "cookie-value-never-logged" not in text


@pytest.mark.parametrize(
    "value",
    [
        "Authorization: Token 0123456789abcdef0123456789abcdef01234567",
        "key=0123456789abcdef0123456789abcdef01234567",
        "enrol with fet_Abc-def_0123456789xyz",
        "call with fat_12_Abc-def_0123456789xyzAbc-def_0123456789xyz012",
        "credential 6f1c2a34-1111-2222-3333-444455556666.Zm9vYmFyYmF6cXV4cXV1eDEyMzQ1Njc4OTA",
        "Bearer abc.def-ghi",
        "postgres://ferry:hunter2@db:5432/ferry",
    ],
)
def test_token_looking_values_are_redacted(value):
    scrubbed = scrub(value)
    assert REDACTED in scrubbed
    drf_key = "0123456789abcdef0123456789abcdef01234567"
    secrets = (drf_key, "fet_Abc", "fat_12", "Zm9vYmFy", "abc.def", "hunter2")
    for secret in secrets:
        assert secret not in scrubbed


def test_secret_keys_are_redacted_and_digests_kept():
    digest = "a" * 64
    event = scrub({"password": "p", "api_token": "t", "nested": {"Authorization": "x"}, "sha256": digest})
    assert event == {
        "password": REDACTED,
        "api_token": REDACTED,
        "nested": {"Authorization": REDACTED},
        "sha256": digest,
    }
    device_id = "6f1c2a34-1111-2222-3333-444455556666"
    assert scrub(f"device {device_id} checked in") == f"device {device_id} checked in"


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_tracebacks_are_redacted_and_show_no_local_variables(fmt):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(fmt))
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    try:
        credential = "6f1c2a34-1111-2222-3333-444455556666.local-secret-never-shown"
        raise ValueError(f"refused fet_Abcdefgh12345 for {credential}")
    except ValueError:
        logger.exception("failed with password=%s", "x")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "ValueError" in text and REDACTED in text
    assert "fet_Abcdefgh12345" not in text and "local-secret-never-shown" not in text
    assert "password=x" not in text and f"password={REDACTED}" in text
