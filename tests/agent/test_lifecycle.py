"""The update lifecycle with real agent processes, real gRPC and real files.

Every test starts from a device already running v1 (a copy of a state directory made once by
a real agent), then offers something over the wire and checks the agent's own files and the
telemetry it sent: the device always ends on exactly one whole version, and every refusal
comes with its reason.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from deploy.package import SignedClaims, generate_keypair, sign_package
from tests.agent.double import (
    ORGANISATION_ID,
    AgentProcess,
    GatewayDouble,
    read_state,
    serve,
    wait_for,
    whole_version,
)
from tests.agent.packages import convert_classifier
from tests.model_packages import write_package

pytestmark = pytest.mark.slow

KEYS = generate_keypair()


def _members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]


def _rewrite(path: Path, out: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("packages")
    u1, u2, u0 = (
        convert_classifier(d / "u1", 0),
        convert_classifier(d / "u2", 1),
        convert_classifier(d / "u0", 2),
    )
    p: dict[str, Path] = {}

    def signed(name: str, src: Path, claims: SignedClaims, key: bytes = KEYS.private_key) -> Path:
        sign_package(src, d / f"{name}.ferry", key, claims)
        p[name] = d / f"{name}.ferry"
        return p[name]

    ours = SignedClaims(organisation=ORGANISATION_ID)
    signed("v1", u1, ours)
    signed("v2", u2, SignedClaims(device_class="pi4", organisation=ORGANISATION_ID))
    signed("other-tenant", u0, SignedClaims(organisation="org-2"))
    signed("other-key", u2, ours, key=generate_keypair().private_key)
    signed("x86", u2, SignedClaims(device_class="x86", organisation=ORGANISATION_ID))
    signed("bad-selftest", convert_classifier(d / "ub", 3, break_selftest=True), ours)
    members = _members(signed("base", u2, ours))
    info, data = members[-1]
    p["tampered"] = _rewrite(
        p["base"], d / "tampered.ferry", [*members[:-1], (info, bytes([data[0] ^ 1]) + data[1:])]
    )
    p["bigger-file"] = _rewrite(p["base"], d / "bigger.ferry", [*members[:-1], (info, data + b"\0" * 4096)])
    p["dotdot"] = _rewrite(p["base"], d / "dotdot.ferry", [*members, (tarfile.TarInfo("../evil"), b"x")])
    link = tarfile.TarInfo(members[-1][0].name)
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    p["symlink"] = _rewrite(p["base"], d / "symlink.ferry", [*members[:-1], (link, b"")])
    big = d / "ubig"
    write_package(
        big,
        graph={
            "nodes": [{"name": "r", "op": "Relu", "inputs": ["x"], "outputs": ["y"], "attrs": {}}],
            "inputs": ["x"],
            "outputs": ["y"],
        },
        tensors={"w": np.zeros(1 << 20, dtype=np.float32)},  # 4 MiB
        inputs=[{"name": "x", "dtype": "float32", "shape": [1, 4]}],
        outputs=[{"name": "y", "dtype": "float32", "shape": [1, 4]}],
    )
    signed("big", big, ours)
    return p


@pytest.fixture(scope="module")
def template(tmp_path_factory, packages) -> Path:
    """A state directory of an enrolled device that runs v1 (made by a real agent, once)."""
    d = tmp_path_factory.mktemp("template")
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    double.publish(packages["v1"], "v1", hint=False)
    agent = AgentProcess(d / "state", port)
    try:
        wait_for(lambda: _settled(d / "state", "v1"), 60, "v1 installed", agent)
        wait_for(lambda: double.activations(), 10, "the activation uploaded", agent)
    finally:
        agent.stop()
        server.stop(grace=None)
    (d / "state" / "update.json").unlink()
    return d / "state"


def _settled(state_dir: Path, version: str) -> bool:
    state = read_state(state_dir)
    return state["update"] == "idle" and state["running"] == version and state["current"] == version


@pytest.fixture
def world(tmp_path: Path, template: Path):
    state_dir = tmp_path / "state"
    shutil.copytree(template, state_dir, symlinks=True)
    (state_dir / "outbox.sqlite").unlink()  # telemetry of the template run is not this test's
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    agents: list[AgentProcess] = []

    def start(**kwargs) -> AgentProcess:
        agents.append(AgentProcess(state_dir, port, **kwargs))
        return agents[-1]

    yield double, state_dir, start
    for agent in agents:
        if agent.process.poll() is None:
            agent.kill()
    server.stop(grace=None)


def _one_whole_version(state_dir: Path) -> str:
    """The invariant checked at every kill: `current` names a complete version, old or new."""
    state = read_state(state_dir)
    assert state["current"] in ("v1", "v2"), state
    assert whole_version(state_dir, state["current"]), f"versions/{state['current']} is not whole"
    return state["current"]


def _refusal(double: GatewayDouble, version_id: str, agent: AgentProcess) -> dict:
    return wait_for(
        lambda: next(
            (a for a in double.activations() if a["version_id"] == version_id and not a["ok"]), None
        ),
        30,
        f"the refusal of {version_id} in telemetry",
        agent,
    )


@pytest.mark.parametrize(
    "point", ["downloading", "verifying", "unpacking", "switching", "switched", "probation"]
)
def test_sigkill_at_every_state_then_the_update_finishes(world, packages, point):
    double, state_dir, start = world
    if point == "downloading":
        double.chunk_bytes, double.chunk_delay = 2048, 0.1  # ~1.5 s for the package: killed midway
        agent = start()
        double.publish(packages["v2"], "v2")
        part = state_dir / "downloads" / f"{double.offer.package_digest}.part"
        wait_for(lambda: part.exists() and part.stat().st_size >= 4096, 30, "a partial download", agent)
    else:
        agent = start(env={"FERRY_AGENT_PAUSE_AT": point, "FERRY_AGENT_PAUSE_SECONDS": "60"})
        double.publish(packages["v2"], "v2")
        agent.wait_log(f"pausing 60 s at {point}")
    before = _one_whole_version(state_dir)
    agent.kill()
    assert _one_whole_version(state_dir) == before
    assert read_state(state_dir)["update"] == (
        "verifying" if point == "unpacking" else point.replace("switched", "switching")
    )

    double.chunk_delay = 0.0
    agent = start()
    wait_for(lambda: _settled(state_dir, "v2"), 60, "v2 running after the restart", agent)
    assert whole_version(state_dir, "v2") and whole_version(state_dir, "v1")  # the previous is kept
    assert os.readlink(state_dir / "previous") == "versions/v1"
    state = read_state(state_dir)
    assert state["staging"] == [] and state["parts"] == []
    wait_for(lambda: any(a["ok"] and a["version_id"] == "v2" for a in double.activations()), 20, "ok", agent)
    assert [a for a in double.activations() if a["version_id"] == "v2"] == [
        a for a in double.activations() if a["version_id"] == "v2" and a["ok"]
    ]
    assert len([a for a in double.activations() if a["version_id"] == "v2"]) == 1
    if point == "downloading":
        assert double.download_offsets[0] == 0 and double.download_offsets[-1] >= 4096, (
            double.download_offsets
        )
    assert agent.stop() == 0
    assert sorted(double.records) == list(range(1, max(double.records) + 1))  # none lost across the kill


def test_crash_loop_of_a_new_version_rolls_back(world, packages):
    double, state_dir, start = world
    agent = start(extra=["--probation-seconds", "120"])
    double.publish(packages["v2"], "v2")
    wait_for(lambda: read_state(state_dir)["update"] == "probation", 30, "v2 in probation", agent)
    for death in (1, 2, 3):  # three unclean deaths within the probation period
        agent.kill()
        agent = start(extra=["--probation-seconds", "120"])
        agent.wait_log(f"resuming in probation after an unclean stop ({death})")
    wait_for(lambda: _settled(state_dir, "v1"), 30, "the rollback to v1", agent)
    refusal = _refusal(double, "v2", agent)
    assert "crash loop" in refusal["reason"] and refusal["rolled_back_to"] == "v1"
    agent.stop()


def test_refused_packages_leave_the_running_version_untouched(world, packages):
    double, state_dir, start = world
    agent = start()
    cases = [
        ("tampered", "weights.bin does not match the sha256 and size in the signed manifest"),
        ("other-key", "does not verify against the trusted release key"),
        ("other-tenant", "signed for organisation 'org-2'; this device belongs to '1'"),
        ("dotdot", "has an unsafe path"),
        ("symlink", "is not a regular file"),
        ("bigger-file", "larger than the"),
        ("x86", "signed for device class 'x86'; this device is 'pi4'"),
        ("bad-selftest", "self-test output"),
    ]
    for name, reason in cases:
        double.publish(packages[name], name)
        refusal = _refusal(double, name, agent)
        assert reason in refusal["reason"], (name, refusal)
        state = read_state(state_dir)
        assert (state["current"], state["running"]) == ("v1", "v1"), (name, state)
        assert not (state_dir / "versions" / name).exists()
        assert state["staging"] == [] and state["parts"] == [] and not (state_dir.parent / "evil").exists()
    # the same refused package in a new assignment (a re-release) is tried, and refused, again
    double.publish(packages["bad-selftest"], "bad-selftest")
    wait_for(
        lambda: len([a for a in double.activations() if a["version_id"] == "bad-selftest"]) == 2,
        30,
        "the second refusal of bad-selftest",
        agent,
    )
    # a package bigger than what the control plane offered (and signed) is cut off
    double.publish(packages["v2"], "v2-short", offered_size=packages["v2"].stat().st_size - 100)
    assert "of a package offered (and signed) as" in _refusal(double, "v2-short", agent)["reason"]

    # a good update still goes through; a rollback is just a newer assignment of the same v1 package
    double.publish(packages["v2"], "v2")
    wait_for(lambda: _settled(state_dir, "v2"), 30, "v2", agent)
    double.publish(packages["v1"], "v1", rollback=True)
    wait_for(lambda: _settled(state_dir, "v1"), 30, "the rollback to v1", agent)
    ok = wait_for(lambda: [a for a in double.activations() if a["ok"]], 10, "activations", agent)
    assert [(a["version_id"], a["reason"]) for a in ok] == [("v2", "update"), ("v1", "rollback")]
    assert all(a.get("code") for a in double.activations() if not a["ok"])  # every refusal is coded
    assert agent.stop() == 0
    shown = subprocess.run(
        [sys.executable, "-m", "agent.cli", "status", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    status = json.loads(shown.stdout)
    assert status["running"]["version_id"] == "v1" and status["running"]["counter"] == double.counter
    assert "signed for organisation 'org-2'" in json.dumps(status["refused"])
    assert status["outbox"]["pending"] == 0


def test_disk_full_and_no_space_are_refused_with_their_reason(world, packages):
    double, state_dir, start = world

    def one_megabyte_files() -> None:  # the disk "fills" at 1 MiB per file for this process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    agent = start(preexec=one_megabyte_files)
    double.publish(packages["big"], "big")
    assert "the disk filled up while downloading" in _refusal(double, "big", agent)["reason"]
    assert read_state(state_dir)["parts"] == [] and read_state(state_dir)["current"] == "v1"
    agent.stop()

    agent = start(extra=["--reserve-bytes", str(1 << 60)])
    double.publish(packages["v2"], "v2")
    assert "not enough free space" in _refusal(double, "v2", agent)["reason"]
    assert read_state(state_dir)["current"] == "v1"
    agent.stop()


def test_download_only_and_maintenance_window_are_honoured(world, packages):
    double, state_dir, start = world
    agent = start()
    closed = {"cron": "0 0 1 1 *", "duration_seconds": 60, "timezone": "UTC"}  # one minute a year
    double.publish(packages["v2"], "v2", window=closed)
    wait_for(lambda: read_state(state_dir)["update"] == "staged", 30, "v2 staged", agent)
    assert whole_version(state_dir, "v2") and read_state(state_dir)["current"] == "v1"
    double.publish(packages["v2"], "v2", download_only=True)
    wait_for(lambda: _staged_offer(state_dir).get("download_only"), 30, "the download-only offer", agent)
    assert read_state(state_dir)["current"] == "v1" and read_state(state_dir)["update"] == "staged"
    double.publish(packages["v2"], "v2")
    wait_for(lambda: _settled(state_dir, "v2"), 30, "v2 once activation is allowed", agent)
    agent.stop()


def _staged_offer(state_dir: Path) -> dict:
    return json.loads((state_dir / "update.json").read_text()).get("offer") or {}


def test_a_hint_triggers_an_immediate_check_in(world, packages):
    double, state_dir, start = world
    double.interval = 60  # the next regular check-in is a minute away
    agent = start()
    wait_for(lambda: double.check_ins >= 1, 30, "the first check-in", agent)
    agent.wait_log("running version")
    wait_for(lambda: double._watchers, 10, "the hints stream", agent)
    double.publish(packages["v2"], "v2", hint=True)
    wait_for(lambda: _settled(state_dir, "v2"), 10, "v2 within seconds of the hint", agent)
    assert double.check_ins == 2
    agent.stop()


def _coded_refusal(double: GatewayDouble, code: str, agent: AgentProcess) -> dict:
    return wait_for(
        lambda: next((a for a in double.activations() if a.get("code") == code and not a["ok"]), None),
        30,
        f"a refusal with code {code} in telemetry",
        agent,
    )


def test_replayed_forged_and_misaddressed_assignments_are_refused_and_survive_restarts(world, packages):
    """Assignments are the only instructions: an old one replayed (even across a restart), one
    for another device or tenant, or one signed by another key never moves the device."""
    double, state_dir, start = world
    agent = start()
    old_v1 = double.publish(packages["v1"], "v1")  # what the device runs: accepted, nothing to do
    wait_for(lambda: double.check_ins >= 2, 30, "a check-in with the v1 assignment", agent)
    double.publish(packages["v2"], "v2")
    wait_for(lambda: _settled(state_dir, "v2"), 30, "v2", agent)
    accepted = json.loads((state_dir / "assignment.json").read_text())
    assert accepted["counter"] == double.counter

    double.offer = old_v1  # a gateway replays the older assignment: refused, v2 stays
    assert "replayed" in _coded_refusal(double, "stale_counter", agent)["reason"]
    agent.stop()
    agent = start()  # the counter is on disk: a restart does not let the replay in
    checked = double.check_ins
    wait_for(lambda: double.check_ins >= checked + 2, 30, "check-ins after the restart", agent)
    assert read_state(state_dir)["current"] == "v2"
    assert json.loads((state_dir / "assignment.json").read_text()) == accepted

    cases = [
        ("wrong_device", dict(changes={"device_id": "device-2"})),
        ("wrong_tenant", dict(changes={"organisation_id": "org-2"})),
        ("bad_signature", dict(signed_by=generate_keypair().private_key)),
        ("expired", dict(changes={"issued_at": 1_000_000, "expires_at": 1_000_060})),
    ]
    for code, how in cases:
        double.publish(packages["v1"], "v1", **how)
        refusal = _coded_refusal(double, code, agent)
        assert refusal["stage"] == "assignment" and refusal["refused"], refusal
        assert read_state(state_dir)["current"] == "v2", code
    # the genuine next assignment (a rollback to v1) still goes through
    double.publish(packages["v1"], "v1", rollback=True)
    wait_for(lambda: _settled(state_dir, "v1"), 30, "the rollback to v1", agent)
    assert agent.stop() == 0
