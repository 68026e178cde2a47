"""A real agent process with ``--llm-port``, updated through the gateway double: a diffusion
version passes its health check (the 2-step image regenerated), goes live and answers
POST /v1/images/generations on 127.0.0.1, its figures reach the telemetry; a version whose
recorded image does not regenerate is rolled back, naming the PSNR, and the previous version
keeps answering with the same image."""

from __future__ import annotations

import io
import json
import tarfile
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from deploy.package import SignedClaims, generate_keypair, sign_package
from deploy.package.manifest import file_entry
from deploy.package.writer import write_archive
from tests.agent.double import ORGANISATION_ID, AgentProcess, GatewayDouble, read_state, serve, wait_for
from tests.agent.llm.test_agent_serves_llm import _free_port as free_port
from tests.engine.diffusion import packages

pytestmark = pytest.mark.slow

KEYS = generate_keypair()
ASK = {"prompt": "a red ferry on the sea", "steps": 2, "seed": 3, "size": "32x32"}


def _resigned(archive: Path, dst: Path, break_selftest: bool = False) -> Path:
    """The converter's package signed for the double's organisation (its selftest image
    replaced by its negative when ``break_selftest``, the manifest updated to match)."""
    with tarfile.open(archive) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.name != "manifest.sig"]
    if break_selftest:
        files = dict(members)
        recorded = np.load(io.BytesIO(files["selftest.npy"]))
        buffer = io.BytesIO()
        np.save(buffer, (255 - recorded).astype(np.uint8))
        files["selftest.npy"] = buffer.getvalue()
        manifest = json.loads(files["manifest.json"])
        manifest["files"] = [file_entry(e["path"], files[e["path"]]) for e in manifest["files"]]
        files["manifest.json"] = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        members = list(files.items())
    unsigned = dst.with_name(dst.name + ".unsigned")
    write_archive(unsigned, members)
    sign_package(unsigned, dst, KEYS.private_key, SignedClaims(organisation=ORGANISATION_ID))
    return dst


def _generate(port: int) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/images/generations",
        data=json.dumps(ASK).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _answered(port: int) -> dict | None:
    try:
        return _generate(port)
    except OSError:  # not listening yet, or still the previous state
        return None


def test_a_diffusion_version_goes_live_answers_and_a_broken_one_rolls_back(tmp_path: Path) -> None:
    built = packages.build(tmp_path / "build", "fp32")
    v1 = _resigned(built.archive, tmp_path / "v1.ferry")
    v2 = _resigned(built.archive, tmp_path / "v2.ferry", break_selftest=True)
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    api_port = free_port()
    agent = AgentProcess(tmp_path / "state", port, extra=["--llm-port", str(api_port)])
    state_dir = tmp_path / "state"
    try:
        double.publish(v1, "v1")
        wait_for(lambda: read_state(state_dir)["running"] == "v1", 120, "v1 running", agent)
        first = wait_for(lambda: _answered(api_port), 60, "the image API answering", agent)
        assert first["size"] == "32x32" and first["data"][0]["b64_json"]
        measured = wait_for(
            lambda: next((m for m in double.metrics() if m.get("image_requests")), None),
            30,
            "the image request in the metrics",
            agent,
        )
        assert measured["version"] == "v1" and measured["image_seconds_per_step"] > 0

        double.publish(v2, "v2")
        refusal = wait_for(
            lambda: next((a for a in double.activations() if a["version_id"] == "v2" and not a["ok"]), None),
            120,
            "the rollback of v2 in telemetry",
            agent,
        )
        assert "PSNR" in refusal["reason"] and refusal["rolled_back_to"] == "v1"
        wait_for(lambda: read_state(state_dir)["current"] == "v1", 30, "v1 current again", agent)
        assert _generate(api_port)["data"] == first["data"]  # same seed, same version, same image
    finally:
        agent.stop()
        server.stop(grace=None)
