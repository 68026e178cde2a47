"""Release-key rotation with a real agent process: it runs v1, the key is rotated
(`manage.py release_key rotate`), and v2, converted and signed under the new key only, installs
because the agent took the rotation at its check-in and stored it.  An agent that was stopped
through two rotations that each retired the key before catches up through the chain."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from accounts.services import organisation_ensure
from django.core.management import call_command
from ferry_cloud.release_key import release_public_key
from ferry_cloud.stack import free_port
from fleet.models import Device
from fleet.services import enrolment_token_create
from gateway.hints import HintHub
from gateway.server import build_server
from registry.models import ModelVersion
from registry.services import conversion_run, model_create, version_upload
from releases.services import release_create

from converter.samples import build_image_classifier
from tests.agent.double import AgentProcess, read_state, wait_for
from tests.e2e.helpers import enrolment_bundle_for

pytestmark = pytest.mark.slow


def _ready_version(model, label: str, seed: int) -> ModelVersion:
    data = build_image_classifier(seed=seed).SerializeToString()
    version = version_upload(model=model, label=label, stream=io.BytesIO(data), size=len(data))
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


def test_an_agent_takes_a_rotation_and_installs_a_package_signed_by_the_new_key(
    transactional_db, settings, tmp_path: Path, capsys
):
    settings.FERRY_RELEASE_KEY_FILE = str(tmp_path / "keys" / "release.key")
    org = organisation_ensure(name="Rotation")
    model = model_create(organisation=org, name="classifier")
    v1 = _ready_version(model, "v1", 5)
    old_key = release_public_key()
    hub = HintHub(redis_url=os.environ.get("REDIS_URL", ""), poll_seconds=0.5)
    port, enrol_port = free_port(), free_port()
    server, _ = build_server(f"127.0.0.1:{port}", workers=4, hub=hub, enrol_address=f"127.0.0.1:{enrol_port}")
    server.start()
    state_dir = tmp_path / "agent"
    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    bundle = enrolment_bundle_for(token, port, enrol_port)
    agent = AgentProcess(state_dir, port, bundle_text=bundle, extra=["--hardware", "generic"])
    try:
        wait_for(lambda: (state_dir / "credential.json").exists(), 30, "enrolment", agent)
        release_create(organisation=org, version=v1, name="v1", target={}, start=True)
        wait_for(lambda: read_state(state_dir)["running"] == str(v1.pk), 60, "v1 running", agent)

        call_command("release_key", "rotate")
        assert "rotation 1" in capsys.readouterr().out
        new_key = release_public_key()
        v2 = _ready_version(model, "v2", 6)  # signed by the new key only
        release_create(organisation=org, version=v2, name="v2", target={}, start=True)
        wait_for(lambda: read_state(state_dir)["running"] == str(v2.pk), 60, "v2 running", agent)
        agent.wait_log("release keys rotated to set 1")
        stored = json.loads((state_dir / "release_keys.json").read_text())
        assert stored["sequence"] == 1 and stored["keys"] == [new_key.hex(), old_key.hex()]
        assert "rotation refused" not in agent.log_text()
        assert agent.stop() == 0
    finally:
        if agent.process.poll() is None:
            agent.kill()
        server.stop(grace=None)
        hub.stop()


def test_an_agent_offline_through_two_retiring_rotations_catches_up_through_the_chain(
    transactional_db, settings, tmp_path: Path, capsys
):
    settings.FERRY_RELEASE_KEY_FILE = str(tmp_path / "keys" / "release.key")
    org = organisation_ensure(name="Rotation chain")
    model = model_create(organisation=org, name="classifier")
    v1 = _ready_version(model, "v1", 5)
    hub = HintHub(redis_url=os.environ.get("REDIS_URL", ""), poll_seconds=0.5)
    port, enrol_port = free_port(), free_port()
    server, _ = build_server(f"127.0.0.1:{port}", workers=4, hub=hub, enrol_address=f"127.0.0.1:{enrol_port}")
    server.start()
    state_dir = tmp_path / "agent"
    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    bundle = enrolment_bundle_for(token, port, enrol_port)
    agent = AgentProcess(state_dir, port, bundle_text=bundle, extra=["--hardware", "generic"])
    try:
        wait_for(lambda: (state_dir / "credential.json").exists(), 30, "enrolment", agent)
        release_create(organisation=org, version=v1, name="v1", target={}, start=True)
        wait_for(lambda: read_state(state_dir)["running"] == str(v1.pk), 60, "v1 running", agent)
        assert agent.stop() == 0  # offline through both rotations

        call_command("release_key", "rotate", "--retire-previous")
        call_command("release_key", "rotate", "--retire-previous")
        assert "rotation 2" in capsys.readouterr().out
        key2 = release_public_key()
        v2 = _ready_version(model, "v2", 6)  # signed by key2 only; key0 and key1 are retired
        release_create(organisation=org, version=v2, name="v2", target={}, start=True)

        agent = AgentProcess(state_dir, port, token="", extra=["--hardware", "generic"])
        wait_for(lambda: read_state(state_dir)["running"] == str(v2.pk), 60, "v2 running", agent)
        agent.wait_log("release keys rotated to set 2")
        assert "release keys rotated to set 1" in agent.log_text()
        assert "rotation refused" not in agent.log_text()
        stored = json.loads((state_dir / "release_keys.json").read_text())
        assert stored["sequence"] == 2 and stored["keys"] == [key2.hex()]
        device = Device.objects.get(pk=json.loads((state_dir / "credential.json").read_text())["device_id"])
        # the next check-in (within one interval) reports the rotation held, so operators see it
        wait_for(
            lambda: (device.refresh_from_db(), device.release_key_sequence)[1] == 2, 90, "sequence 2", agent
        )
        assert agent.stop() == 0
    finally:
        if agent.process.poll() is None:
            agent.kill()
        server.stop(grace=None)
        hub.stop()
