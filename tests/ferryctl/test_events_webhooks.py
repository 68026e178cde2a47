"""ferryctl events (the feed, and --follow over the SSE stream), releases watch woken by the stream,
and webhooks list/create/delete, as processes against a live server."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
from django.conf import settings
from ferry_cloud import event_stream
from fleet.services import device_enrol, enrolment_token_create
from registry.models import ModelVersion
from registry.services import conversion_run, model_create, version_upload
from releases.services import release_create, release_transition

from tests.ferryctl.conftest import ROOT
from tests.platform.conftest import onnx_bytes


@pytest.fixture
def version(org):
    data = onnx_bytes()
    model = model_create(organisation=org, name="detector")
    created = version_upload(model=model, label="v1", stream=io.BytesIO(data), size=len(data))
    conversion_run(job_id=created.job.pk)  # the worker's part, here
    return ModelVersion.objects.get(pk=created.pk)


@pytest.fixture
def device(org):
    token = enrolment_token_create(organisation=org).token
    return device_enrol(token=token, name="cam", attributes={}, labels={"site": "lab"}).device


def _release(org, version, device, name):
    return release_create(
        organisation=org, version=version, name=name, target={"device_ids": [str(device.pk)]}, start=True
    )


def _spawn(live_server, admin, tmp_path, *args: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "FERRY_URL": live_server.url,
        "FERRY_TOKEN": admin[1],
    }
    return subprocess.Popen(
        [sys.executable, "-m", "ferryctl", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_a_stream(process: subprocess.Popen) -> None:
    """Until the live server (this process) holds the CLI's stream open."""
    deadline = time.monotonic() + 60
    while not (event_stream._slots and event_stream._slots._value < settings.FERRY_SSE_STREAMS_PER_PROCESS):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "ferryctl never opened the event stream"
        time.sleep(0.05)


@pytest.mark.slow
def test_events_lists_the_feed_and_follows_it_across_reconnects(
    ferryctl, live_server, admin, org, version, device, tmp_path
):
    settings.FERRY_SSE_MAX_SECONDS = 1  # several reconnects with Last-Event-ID during the test
    settings.FERRY_SSE_POLL_SECONDS = 0.1
    first = _release(org, version, device, "first")
    listed = ferryctl("events", "--json")
    assert listed.code == 0, listed.stderr
    assert [e["type"] for e in listed.json()] == ["release.started", "release.created"]
    table = ferryctl("events", "--release", str(first.pk))
    assert table.code == 0 and "release.started" in table.stdout and "first" in table.stdout

    newest = listed.json()[0]["id"]
    follower = _spawn(
        live_server, admin, tmp_path,
        "events", "--follow", "--json", "--type", "release.aborted", "--type", "release.completed",
        "--count", "2", "--timeout", "120", "--after-id", str(newest),
    )  # fmt: skip
    try:
        release_transition(release_id=first.pk, action="abort", reason="stop")
        time.sleep(2.5)  # the CLI's stream ends twice meanwhile; it resumes after the abort
        second = _release(org, version, device, "second")
        release_transition(release_id=second.pk, action="advance", reason="done")
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert [(e["type"], e["release_name"]) for e in lines] == [
        ("release.aborted", "first"),
        ("release.completed", "second"),
    ]


@pytest.mark.slow
def test_releases_watch_is_woken_by_the_stream(live_server, admin, org, version, device, tmp_path):
    settings.FERRY_SSE_POLL_SECONDS = 0.1
    release = _release(org, version, device, "watched")
    # polling every 10 minutes: only the stream can end this watch before the timeout
    watch = _spawn(
        live_server, admin, tmp_path, "releases", "watch", str(release.pk), "--json", "--interval", "600",
        "--timeout", "900",
    )  # fmt: skip
    try:
        _wait_for_a_stream(watch)
        release_transition(release_id=release.pk, action="rollback", reason="bad numbers")
        stdout, stderr = watch.communicate(timeout=120)
    finally:
        watch.kill()
    assert watch.returncode == 1, stderr  # rolled back: not completed
    assert json.loads(stdout)["release"]["state"] == "rolled_back"


@pytest.mark.slow
def test_webhooks_create_list_and_delete(ferryctl):
    created = ferryctl(
        "webhooks", "create", "https://hooks.example.com/ferry", "--type", "release.completed",
        "--description", "CI", "--json",
    )  # fmt: skip
    assert created.code == 0, created.stderr
    hook = created.json()
    assert hook["secret"].startswith("whsec_") and hook["event_types"] == ["release.completed"]
    listed = ferryctl("webhooks", "list", "--json").json()
    assert [(h["id"], h["url"]) for h in listed] == [(hook["id"], "https://hooks.example.com/ferry")]
    assert "secret" not in listed[0]
    log = ferryctl("webhooks", "deliveries", hook["id"], "--json")
    assert log.code == 0 and log.json() == []
    unknown = ferryctl("webhooks", "create", "https://x.example", "--type", "release.finished")
    assert unknown.code == 2 and "event_types" in unknown.stderr
    assert ferryctl("webhooks", "delete", hook["id"]).code == 0
    assert ferryctl("webhooks", "list", "--json").json() == []
