"""An update through the real control plane: a version converted and signed by the registry,
released, pushed to a watching agent by a hint, the agent SIGKILLed between the pointer switch
and the health check, restarted, and the update finished and reported exactly once."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from accounts.services import organisation_ensure
from ferry_cloud.stack import free_port
from fleet.models import Device
from fleet.services import enrolment_token_create
from gateway.hints import HintHub
from gateway.server import build_server
from registry.models import ModelVersion
from registry.services import conversion_run, model_create, version_upload
from releases.models import DeviceAssignment
from releases.services import release_create
from telemetry.models import TelemetryRecord

from converter.samples import build_image_classifier
from tests.agent.double import AgentProcess, read_state, wait_for
from tests.e2e.helpers import enrolment_bundle_for

pytestmark = pytest.mark.slow


def _ready_version(org) -> ModelVersion:
    data = build_image_classifier(seed=5).SerializeToString()
    model = model_create(organisation=org, name="classifier")
    version = version_upload(model=model, label="v1", stream=io.BytesIO(data), size=len(data))
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


def test_update_from_the_real_control_plane_survives_a_sigkill(transactional_db, tmp_path: Path):
    org = organisation_ensure(name="Update")
    version = _ready_version(org)
    hub = HintHub(redis_url=os.environ.get("REDIS_URL", ""), poll_seconds=0.5)
    port, enrol_port = free_port(), free_port()
    server, _ = build_server(f"127.0.0.1:{port}", workers=4, hub=hub, enrol_address=f"127.0.0.1:{enrol_port}")
    server.start()
    state_dir = tmp_path / "agent"
    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    pause = {"FERRY_AGENT_PAUSE_AT": "switched", "FERRY_AGENT_PAUSE_SECONDS": "60"}
    bundle = enrolment_bundle_for(token, port, enrol_port)
    agent = AgentProcess(state_dir, port, bundle_text=bundle, env=pause, extra=["--hardware", "generic"])
    try:
        wait_for(lambda: (state_dir / "credential.json").exists(), 30, "enrolment", agent)
        wait_for(lambda: hub.watchers == 1, 30, "the hints stream", agent)
        release_create(organisation=org, version=version, name="to the lab", target={}, start=True)
        agent.wait_log("pausing 60 s at switched")  # woken by the hint, not by its 30 s interval
        assert read_state(state_dir)["current"] == str(version.pk)
        agent.kill()

        agent = AgentProcess(state_dir, port, token="", extra=["--hardware", "generic"])
        wait_for(
            lambda: read_state(state_dir)["running"] == str(version.pk), 30, "the update finished", agent
        )
        device = Device.objects.get(pk=json.loads((state_dir / "credential.json").read_text())["device_id"])
        wait_for(
            lambda: TelemetryRecord.objects.filter(device=device, kind="activation").exists(),
            30,
            "report",
            agent,
        )
        assert agent.stop() == 0
        activations = list(TelemetryRecord.objects.filter(device=device, kind="activation"))
        assert [(a.payload["ok"], a.payload["version_id"]) for a in activations] == [(True, str(version.pk))]
        assert activations[0].payload["counter"] == DeviceAssignment.objects.get(device=device).counter
        device.refresh_from_db()
        assert device.running_version_id == version.pk
    finally:
        if agent.process.poll() is None:
            agent.kill()
        server.stop(grace=None)
        hub.stop()
