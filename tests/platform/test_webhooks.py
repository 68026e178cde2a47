"""Webhooks: subscriptions over the API, signed deliveries sent by a real Celery worker to a real
HTTP receiver, retried with backoff after a 500, logged, and redelivered on request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import connection
from fleet.services import device_enrol, enrolment_token_create
from releases.services import release_create, release_transition
from webhooks.models import WebhookDelivery
from webhooks.services import retry_delay
from webhooks.signing import SignatureInvalid, sign, verify

from tests.platform.test_api_events import _refuse

ROOT = Path(__file__).resolve().parents[2]


def test_a_signature_verifies_only_with_its_secret_body_and_time():
    body = b'{"type": "release.completed"}'
    header = sign("whsec_a", body, timestamp=1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify("whsec_a", body, header, now=1_700_000_100) == 1_700_000_000
    for secret, sent, now, why in (
        ("whsec_b", body, 1_700_000_100, "no signature matches"),
        ("whsec_a", body + b" ", 1_700_000_100, "no signature matches"),
        ("whsec_a", body, 1_700_000_301, "tolerance"),
    ):
        with pytest.raises(SignatureInvalid, match=why):
            verify(secret, sent, header, now=now)
    with pytest.raises(SignatureInvalid, match="malformed"):
        verify("whsec_a", body, "v1=abc", now=1_700_000_100)


def test_retries_back_off_exponentially_up_to_a_cap(settings):
    settings.FERRY_WEBHOOK_RETRY_BASE_SECONDS = 30
    settings.FERRY_WEBHOOK_RETRY_MAX_SECONDS = 3600
    assert [retry_delay(n) for n in range(1, 10)] == [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]


@pytest.mark.django_db
def test_subscriptions_show_the_secret_once_and_refuse_unknown_types(api):
    created = api.post(
        "/api/v1/webhooks/",
        {"url": "https://hooks.example.com/ferry", "event_types": ["release.completed"]},
        format="json",
    )
    assert created.status_code == 201, created.content
    hook = created.json()
    assert hook["secret"].startswith("whsec_") and created["Location"].endswith(f"/webhooks/{hook['id']}/")
    listed = api.get("/api/v1/webhooks/").json()["results"]
    assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
    shown = api.get(f"/api/v1/webhooks/{hook['id']}/")
    assert "secret" not in shown.json()

    bad = api.post("/api/v1/webhooks/", {"url": "https://x.example", "event_types": ["nope"]}, format="json")
    assert bad.status_code == 400 and "event_types" in bad.json()["error"]["fields"]
    ftp = api.post("/api/v1/webhooks/", {"url": "ftp://x.example/"}, format="json")
    assert ftp.status_code == 400 and "url" in ftp.json()["error"]["fields"]

    stale = api.patch(
        f"/api/v1/webhooks/{hook['id']}/", {"active": False}, format="json", HTTP_IF_MATCH='"x"'
    )
    assert stale.status_code == 412
    off = api.patch(
        f"/api/v1/webhooks/{hook['id']}/", {"active": False}, format="json", HTTP_IF_MATCH=shown["ETag"]
    )
    assert off.status_code == 200 and off.json()["active"] is False
    rotated = api.post(f"/api/v1/webhooks/{hook['id']}/rotate-secret/").json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != hook["secret"]
    assert api.delete(f"/api/v1/webhooks/{hook['id']}/").status_code == 204
    assert api.get(f"/api/v1/webhooks/{hook['id']}/").status_code == 404


class Receiver:
    """A real HTTP endpoint: answers each POST with the next status of ``statuses`` (then 200)
    and keeps what it received."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.received: list[dict] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                with receiver.arrived:
                    receiver.received.append(
                        {"headers": dict(self.headers), "body": body, "answered": status}
                    )
                    receiver.arrived.notify_all()
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"try again")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, count: int, timeout: float = 60) -> list[dict]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.received) >= count, timeout), self.received
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A real Celery worker process on the test database and the suite's Redis broker, with
    retries one second apart (then two, four...)."""
    database = connection.settings_dict
    url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
    log_path = tmp_path / "worker.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below, after the process
    env = {
        **os.environ,
        "FERRY_DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform")]),
        "FERRY_WEBHOOK_RETRY_BASE_SECONDS": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ferry_cloud", "worker", "--pool", "solo", "-l", "INFO"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 90
        while "ready." not in log_path.read_text():
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the Celery worker did not start within 90 s"
            time.sleep(0.2)
        yield log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.mark.slow
def test_a_signed_event_reaches_a_real_receiver_after_a_500_and_can_be_redelivered(
    api, org, admin, ready_version, worker
):
    receiver = Receiver([500])
    try:
        hook = api.post(
            "/api/v1/webhooks/",
            {"url": receiver.url, "event_types": ["release.aborted", "device.refused"]},
            format="json",
        ).json()
        device = device_enrol(
            token=enrolment_token_create(organisation=org).token, name="cam", attributes={}, labels={}
        ).device
        release = release_create(
            organisation=org,
            version=ready_version,
            name="to abort",
            target={"device_ids": [str(device.pk)]},
            actor=admin[0],
            start=True,
        )  # created and started: not subscribed, nothing sent
        release_transition(release_id=release.pk, action="abort", actor=admin[0], reason="stop")

        failed, succeeded = receiver.wait_for(2)
        assert (failed["answered"], succeeded["answered"]) == (500, 200)
        assert failed["body"] == succeeded["body"]  # a retry sends the same bytes, signed afresh
        for request in (failed, succeeded):
            headers = request["headers"]
            assert verify(hook["secret"], request["body"], headers["Ferry-Signature"])
            assert headers["Ferry-Event"] == "release.aborted"
            assert headers["Content-Type"] == "application/json"
        event = json.loads(succeeded["body"])
        assert event["type"] == "release.aborted" and event["release"] == str(release.pk)
        assert event["actor"] == "alice" and event["reason"] == "stop"
        feed = api.get(f"/api/v1/audit/?release={release.pk}&type=release.aborted").json()["results"]
        assert feed == [event]  # the same JSON the feed and the stream carry

        delivery_id = succeeded["headers"]["Ferry-Delivery"]
        deadline = time.monotonic() + 30
        while WebhookDelivery.objects.get(pk=delivery_id).state != "succeeded":  # recorded after the answer
            assert time.monotonic() < deadline
            time.sleep(0.1)
        log = api.get(f"/api/v1/webhooks/{hook['id']}/deliveries/").json()["results"]
        assert [(d["event_type"], d["state"], d["attempts"]) for d in log] == [
            ("release.aborted", "succeeded", 2)
        ]
        attempts = log[0]["log"]
        assert [(a["status_code"], a["error"]) for a in attempts] == [(500, "HTTP 500"), (200, "")]

        again = api.post(f"/api/v1/webhooks/{hook['id']}/deliveries/{delivery_id}/redeliver/")
        assert again.status_code == 201 and again.json()["redelivery_of"] == delivery_id
        third = receiver.wait_for(3)[2]
        assert third["body"] == succeeded["body"] and third["headers"]["Ferry-Delivery"] == again.json()["id"]
        assert verify(hook["secret"], third["body"], third["headers"]["Ferry-Signature"])

        second = release_create(
            organisation=org,
            version=ready_version,
            name="refused",
            target={"device_ids": [str(device.pk)]},
            start=True,
        )
        _refuse(device, second, ready_version)
        refusal = receiver.wait_for(4)[3]
        assert refusal["headers"]["Ferry-Event"] == "device.refused"
        assert json.loads(refusal["body"])["details"]["reason_code"] == "device_class"
    finally:
        receiver.close()


@pytest.mark.slow
def test_a_bulk_device_action_reaches_the_webhooks_subscribed_to_its_type(api, org, worker):
    receiver = Receiver([])
    try:
        hook = api.post(
            "/api/v1/webhooks/", {"url": receiver.url, "event_types": ["devices.bulk_label"]}, format="json"
        ).json()
        for i in range(3):
            token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
            device_enrol(token=token, name=f"cam-{i}", attributes={}, labels={})
        bulk = "/api/v1/devices/bulk/"
        unpin = {"filter": "labels.site == lab", "action": "unpin"}
        assert api.post(bulk, unpin, format="json").status_code == 200  # a type it does not want
        label = {"filter": "labels.site == lab", "action": "label", "labels": {"row": "3"}}
        assert api.post(bulk, label, format="json").json() == {"matched": 3, "changed": 3, "dry_run": False}

        [request] = receiver.wait_for(1)
        assert verify(hook["secret"], request["body"], request["headers"]["Ferry-Signature"])
        assert request["headers"]["Ferry-Event"] == "devices.bulk_label"
        event = json.loads(request["body"])
        assert (event["type"], event["actor"], event["release"]) == ("devices.bulk_label", "alice", None)
        details = event["details"]
        assert (details["action"], details["filter"], details["labels"]) == (
            "label",
            "labels.site == lab",
            {"row": "3"},
        )
        assert (details["matched"], details["changed"]) == (3, 3)
        feed = api.get("/api/v1/audit/?type=devices.bulk_label").json()["results"]
        assert feed == [event]  # the same JSON the feed carries
        time.sleep(1)  # the unpin event was never queued: nothing else arrives
        assert len(receiver.received) == 1
    finally:
        receiver.close()


@pytest.fixture
def queued(monkeypatch):
    """What the services hand to the queue port (delivery id, countdown), instead of Celery."""
    from webhooks import services

    sent: list[tuple[str, float | None]] = []
    monkeypatch.setitem(services._queue, "send", lambda pk, countdown: sent.append((pk, countdown)))
    return sent


@pytest.mark.django_db
def test_attempts_are_leased_backed_off_swept_and_given_up(org, settings, queued):
    from datetime import timedelta

    from django.utils import timezone
    from webhooks import services

    settings.FERRY_WEBHOOK_MAX_ATTEMPTS = 2
    settings.FERRY_WEBHOOK_RETRY_BASE_SECONDS = 1000  # longer than a countdown: the sweep's
    receiver = Receiver([503, 503])
    try:
        hook = services.webhook_create(organisation=org, url=receiver.url, event_types=["release.aborted"])
        assert (
            services.deliveries_create(
                organisation_id=org.pk, event_id=7, event_type="release.started", payload={"id": 7}
            )
            == []
        )  # not a type it wants
        [delivery] = services.deliveries_create(
            organisation_id=org.pk, event_id=8, event_type="release.aborted", payload={"id": 8}
        )
        first = services.delivery_attempt(delivery_id=delivery.pk)
        assert (first.state, first.attempts, first.last_status_code) == ("pending", 1, 503)
        assert first.next_attempt_at > timezone.now() + timedelta(seconds=900)
        assert queued == []  # a 1000 s wait is not a countdown: the sweep sends it when due
        assert services.delivery_attempt(delivery_id=delivery.pk) is None  # not due: nothing sent
        assert services.deliveries_due() == []

        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            next_attempt_at=timezone.now() - timedelta(hours=1)
        )
        assert services.deliveries_send_due() == [str(delivery.pk)] and queued == [(str(delivery.pk), None)]
        last = services.delivery_attempt(delivery_id=delivery.pk)
        assert (last.state, last.attempts, last.next_attempt_at) == ("failed", 2, None)
        assert [a["status_code"] for a in last.log] == [503, 503] and len(receiver.received) == 2
        assert services.delivery_attempt(delivery_id=delivery.pk) is None  # failed stays failed
        assert hook.deliveries.count() == 1
    finally:
        receiver.close()


@pytest.mark.django_db
def test_private_addresses_are_refused_unless_allowed(org, settings, queued):
    from webhooks import services

    settings.FERRY_WEBHOOK_ALLOW_PRIVATE = False
    settings.FERRY_WEBHOOK_RETRY_BASE_SECONDS = 2
    receiver = Receiver([])
    try:
        services.webhook_create(organisation=org, url=receiver.url, event_types=[])
        [delivery] = services.deliveries_create(
            organisation_id=org.pk, event_id=9, event_type="release.aborted", payload={"id": 9}
        )
        refused = services.delivery_attempt(delivery_id=delivery.pk)
        assert refused.last_status_code is None and "not a public address" in refused.last_error
        assert receiver.received == [] and queued == [(str(delivery.pk), 2.0)]  # retried by countdown
    finally:
        receiver.close()
