"""An LLM release is gated on its chat traffic like a vision release on its inferences: the
platform converts an uploaded checkpoint whose chat template breaks on multi-turn chats, the
release offers it, each device unpacks the signed package the platform stored, passes the health
check, serves chats over real HTTP and sends the metrics record its agent would; the gate reads
the served requests as inferences and the failed ones as errors and pauses the release, and the
hourly series of the version shows the same traffic."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from ferry_cloud.release_key import release_public_key
from registry.models import ModelVersion
from releases.models import Release
from releases.services import release_gate_evaluate
from telemetry.series import version_vs_fleet_hourly
from telemetry.services import IncomingRecord, telemetry_ingest

from agent.llm_api.health import llm_health_check
from agent.llm_api.server import LlmApiServer
from agent.llm_api.service import LlmService
from deploy.package import verify_and_unpack
from tests.agent.llm.test_gate_figures import ONE_TURN, TWO_TURNS, break_multi_turn, chat, post
from tests.engine.llm.checkpoints import write_checkpoint
from tests.platform.registry.test_adapter_versions import _llm
from tests.platform.releases.test_rollout_api import _create, _devices, _install


@pytest.fixture(scope="module")
def broken_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("llm-release") / "tiny"
    write_checkpoint(directory, "qwen2", max_position_embeddings=64)
    break_multi_turn(directory)
    return directory


def _unpack_on_device(version: ModelVersion, directory: Path) -> Path:
    """What an agent does with the offered package: verify the platform's signature, unpack, check."""
    with version.package.file.open("rb") as stored:
        (directory / "package.ferry").write_bytes(stored.read())
    verify_and_unpack(directory / "package.ferry", directory / "unpacked", release_public_key())
    llm_health_check(directory / "unpacked")  # passes: the template is not part of the check
    return directory / "unpacked"


def _serve_chats(unpacked: Path, version: ModelVersion) -> dict:
    """Three one-turn chats (served) and one two-turn chat (fails in the template) over HTTP; the
    metrics record the agent's daemon would send for them (agent/daemon.py record_metrics)."""
    server = LlmApiServer(LlmService(unpacked, name="m", version_id=str(version.pk)), port=0)
    server.start()
    try:
        statuses = [
            post(server.address, chat(messages)) for messages in (ONE_TURN, ONE_TURN, ONE_TURN, TWO_TURNS)
        ]
        figures = server.service.take_figures()
    finally:
        server.stop()
    assert statuses == [200, 200, 200, 500]
    return {**figures, "version": str(version.pk), "restarts": 0}


@pytest.mark.django_db(transaction=True)
def test_an_llm_release_whose_chats_fail_trips_the_error_gate(api, org, broken_checkpoint, tmp_path):
    version = _llm(api, broken_checkpoint, "tiny")
    devices = _devices(org, 2, None)  # new devices: a vision model's would not fit the chat model
    since = timezone.now() - timedelta(minutes=1)
    release = _create(api, version, gate={"max_error_rate": 0.05}, start=True).json()
    assert len(_install(devices, version)) == 2
    unpacked = _unpack_on_device(version, tmp_path)
    for device in devices:
        payload = _serve_chats(unpacked, version)
        record = IncomingRecord(1, "metrics", time.time(), str(version.pk), payload)
        telemetry_ingest(device=device, records=[record])

    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "pause" and not status["passed"]
    assert any(f.startswith("inference error rate 0.25 >") for f in status["failures"]), status["failures"]
    assert status["figures"]["devices_reporting"] == 2 and status["figures"]["latency_ms_p95"] > 0
    assert Release.objects.get(pk=release["id"]).state == "paused"

    series = version_vs_fleet_hourly(
        organisation_id=org.pk, version_id=str(version.pk), since=since, until=timezone.now()
    )
    assert sum(h.inferences for h in series.version) == 6 and sum(h.errors for h in series.version) == 2
    assert any(h.latency_ms_p95 for h in series.version)
