"""The agent's identity over real TLS against the test double: `ferry-agent enrol <bundle>`
pins the bundle's CA, refuses a gateway of another CA, and the running agent renews its
certificate at two thirds of its lifetime without missing a check-in."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest

from deploy.package import generate_keypair
from deploy.trust import certificates
from deploy.trust.bundle import EnrolmentBundle, decode_bundle, encode_bundle
from tests.agent.double import DEVICE_ID, ROOT, AgentProcess, GatewayDouble, bundle, serve, wait_for


@pytest.fixture
def double():
    double = GatewayDouble(generate_keypair())
    server, port = serve(double)
    yield double, port
    server.stop(grace=None)


def _enrol(line: str, state_dir) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "agent.cli", "enrol", line, "--state-dir", str(state_dir), "--name", "d"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_enrol_pins_the_bundles_ca_and_keeps_the_key_private(double, tmp_path):
    _, port = double
    result = _enrol(bundle(port), tmp_path / "agent")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == DEVICE_ID
    saved = json.loads((tmp_path / "agent" / "credential.json").read_text())
    assert saved["device_id"] == DEVICE_ID and saved["gateway"] == f"127.0.0.1:{port}"
    assert (tmp_path / "agent" / "device.pem").stat().st_mode & 0o777 == 0o600
    pinned = (tmp_path / "agent" / "ca.pem").read_bytes()
    assert certificates.fingerprint(pinned) == decode_bundle(bundle(port)).ca_fingerprint


def test_enrol_refuses_a_gateway_of_another_ca(double, tmp_path):
    _, port = double
    honest = decode_bundle(bundle(port))
    other_ca = certificates.create_ca("what the device was told to trust")
    line = encode_bundle(
        EnrolmentBundle(honest.gateway, honest.enrol, honest.token, other_ca.certificate_pem)
    )
    result = _enrol(line, tmp_path / "agent")
    assert result.returncode == 2
    assert "pinned CA" in result.stderr
    assert not (tmp_path / "agent" / "credential.json").exists()
    bad = _enrol("ferry-enrol-1:garbage", tmp_path / "agent")
    assert bad.returncode == 2 and "damaged" in bad.stderr


@pytest.mark.slow
def test_the_agent_renews_its_certificate_before_it_expires(double, tmp_path):
    gateway, port = double
    gateway.certificate_lifetime = timedelta(seconds=6)  # renewed at ~4 s, again and again
    agent = AgentProcess(tmp_path / "agent", port)
    try:
        agent.wait_log("renewed the client certificate", timeout=30)
        wait_for(lambda: gateway.renewals >= 3, 30, "three renewals", agent)
        # 15 s in, the first certificate is long expired: check-ins go on with the renewed ones
        before = gateway.check_ins
        wait_for(lambda: gateway.check_ins >= before + 2, 15, "check-ins after renewals", agent)
        assert "refuses" not in agent.log_text()
        assert agent.stop() == 0
    finally:
        if agent.process.poll() is None:
            agent.kill()
