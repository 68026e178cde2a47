"""Release history with real processes: web, worker, beat, the gRPC gateway and three real agents,
everything through the REST API, every step a new signed assignment (deploy/trust).

v1 → v2 → roll back → re-release v2 → roll back again → v3 → v2 once more: every device follows
every step (a re-release after a rollback used to be refused forever by the package's release
counter).  Then one device is pinned to v1 while the fleet runs v2; it stays there across
check-ins and an agent restart (which the release's default gate, evaluated every second, does not
count: it is not on the release's version), and returns to the release's version when unpinned
even though the release is paused by then (pause stops spreading; it does not go back).  The time
from each action to all three agents running its version is printed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psycopg
import pytest
from ferry_cloud.stack import RestClient, Stack, free_port

from converter.samples import build_image_classifier
from tests.e2e.fleet_stack import release_environment
from tests.e2e.helpers import bootstrap_admin, wait_until

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"fleet": "history"}
AGENTS = 3
AGENT_ARGS = ["--metrics-interval", "1", "--upload-interval", "1"]
# The default gate, on: a pinned device's telemetry (its version is not the release's) must not
# count against the release, and a paused release keeps the devices it already reached. All but
# the p95 latency ratio: over one-second metrics windows on a shared CI machine, a version's first
# inferences after activation (cold caches) against warm neighbours measure the load, not the
# model (seen at 2.4 between two same-sized models); it is tested with chosen figures in
# tests/platform/releases.
GATE = {"max_latency_p95_ratio": None}

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture
def environment(tmp_path: Path):
    with release_environment(tmp_path, "ferry_history", checkin_seconds=2, gate_seconds=1) as environment:
        yield environment


def _upload(api: RestClient, model_id: int, label: str, seed: int) -> str:
    files = {"file": ("model.onnx", build_image_classifier(seed=seed).SerializeToString())}
    return api.call("POST", f"models/{model_id}/versions/", files=files, data={"label": label})["id"]


def _on_device(state_dir: Path) -> str:
    """The version the agent itself committed to (its running.json)."""
    try:
        return json.loads((state_dir / "running.json").read_text()).get("version_id", "")
    except (FileNotFoundError, ValueError):
        return ""


def _versions_run(database_url: str, device_id: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT v.label FROM fleet_deviceversionchange c JOIN registry_modelversion v "
            "ON v.id = c.to_version_id WHERE c.device_id = %s ORDER BY c.at, c.id",
            (device_id,),
        ).fetchall()
    return [label for (label,) in rows]


class Scenario:
    def __init__(self, api: RestClient, stack: Stack, tmp_path: Path, versions: dict[str, str]) -> None:
        self.api, self.stack, self.tmp_path, self.versions = api, stack, tmp_path, versions
        self.labels = {v: k for k, v in versions.items()}
        self.timings: list[tuple[str, float]] = []

    def state_dir(self, i: int) -> Path:
        return self.tmp_path / f"agent-{i}"

    def device_id(self, i: int) -> str:
        return json.loads((self.state_dir(i) / "credential.json").read_text())["device_id"]

    def on_devices(self) -> list[str]:
        return [self.labels.get(_on_device(self.state_dir(i)), "") for i in range(AGENTS)]

    def reported(self) -> dict[str, str | None]:
        return {
            d["id"]: (d["running_version_info"] or {}).get("label")
            for d in self.api.call("GET", "devices/")["results"]
        }

    def expect(self, what: str, started: float, labels: list[str]) -> None:
        """Wait until each agent runs labels[i] (its own files and the control plane agree)."""
        try:
            wait_until(
                f"{what}: agents on {labels}", lambda: self.on_devices() == labels, self.stack, timeout=90
            )
        except AssertionError as exc:
            releases = [
                (r["name"], r["state"], (r.get("gate_status") or {}).get("reason"))
                for r in self.api.call("GET", "releases/")["results"]
            ]
            raise AssertionError(f"{exc}; agents on {self.on_devices()}; releases {releases}") from None
        seconds = time.monotonic() - started
        self.timings.append((what, seconds))
        print(f"{what}: all {AGENTS} agents running {sorted(set(labels))} after {seconds:.1f} s")
        wanted = {self.device_id(i): labels[i] for i in range(AGENTS)}
        wait_until(f"{what}: reported", lambda: self.reported() == wanted, self.stack, timeout=30)

    def release(self, label: str, phases: list[dict] | None = None) -> dict:
        return self.api.call(
            "POST",
            "releases/",
            json={
                "name": f"{label} {time.monotonic():.0f}",
                "version": self.versions[label],
                "target": {"labels": LABELS},
                "start": True,
                "allow_empty": True,
                "gate": GATE,
                **({"phases": phases} if phases else {}),
            },
        )

    def act(self, release: dict, action: str) -> dict:
        return self.api.call("POST", f"releases/{release['id']}/{action}/", json={"reason": "e2e"})

    def pin(self, i: int, label: str | None) -> None:
        version = self.versions[label] if label else None
        self.api.call("POST", f"devices/{self.device_id(i)}/pin/", json={"version": version})

    def start_agent(self, i: int, token: str) -> None:
        self.stack.start_agent(
            f"agent-{i}", self.gateway_port, self.state_dir(i), token, {}, extra=AGENT_ARGS
        )

    def restart_agent(self, i: int) -> None:
        name = f"agent-{i}"
        process = next(p for n, p in self.stack.processes if n == name)
        process.terminate()
        assert process.wait(timeout=20) == 0
        self.stack.processes = [(n, p) for n, p in self.stack.processes if p is not process]
        self.start_agent(i, "")


def test_every_device_follows_every_release_rollback_and_pin(environment, tmp_path: Path):
    env = {**os.environ, **environment}
    token = bootstrap_admin(env, "History E2E")
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port = free_port(), free_port()
    try:
        stack.start_control_plane(http_port, gateway_port)
        api = RestClient(f"http://127.0.0.1:{http_port}", token)
        model = api.call("POST", "models/", json={"name": "classifier"})
        versions = {
            label: _upload(api, model["id"], label, seed) for seed, label in enumerate(("v1", "v2", "v3"))
        }
        wait_until(
            "three converted versions",
            lambda: all(api.call("GET", f"versions/{v}/")["status"] == "ready" for v in versions.values()),
            stack,
            timeout=90,
        )
        s = Scenario(api, stack, tmp_path, versions)
        s.gateway_port = gateway_port
        everyone = lambda label: [label] * AGENTS  # noqa: E731

        started = time.monotonic()
        s.release("v1")
        for i in range(AGENTS):
            s.start_agent(i, api.call("POST", "enrolment-tokens/", json={"labels": LABELS})["token"])
        s.expect("v1 released, agents enrolled", started, everyone("v1"))

        started = time.monotonic()
        v2 = s.release("v2")
        s.expect("v2 released", started, everyone("v2"))

        started = time.monotonic()
        s.act(v2, "rollback")
        s.expect("v2 rolled back", started, everyone("v1"))

        started = time.monotonic()
        v2_again = s.release("v2")
        s.expect("v2 re-released after its rollback", started, everyone("v2"))

        started = time.monotonic()
        s.act(v2_again, "rollback")
        s.expect("v2 rolled back again", started, everyone("v1"))

        started = time.monotonic()
        s.release("v3")
        s.expect("v3 released", started, everyone("v3"))

        started = time.monotonic()
        # a long soak keeps this release active, its gate evaluated every second, through the
        # pin, the restart and the pause below
        v2_soaking = s.release("v2", phases=[{"percentage": 100, "min_soak_seconds": 3600}])
        s.expect("v2 released a third time", started, everyone("v2"))

        # one device pinned to v1 while the fleet runs v2: it stays, across check-ins and a restart
        started = time.monotonic()
        s.pin(0, "v1")
        s.expect("device 0 pinned to v1", started, ["v1", "v2", "v2"])
        counter = json.loads((s.state_dir(0) / "assignment.json").read_text())["counter"]
        time.sleep(5)  # two check-in intervals: the same assignment, nothing moves
        assert s.on_devices() == ["v1", "v2", "v2"]
        assert json.loads((s.state_dir(0) / "assignment.json").read_text())["counter"] == counter
        s.restart_agent(0)
        time.sleep(5)
        assert s.on_devices() == ["v1", "v2", "v2"]
        # the pinned device's restart on v1 is not the release's business: its gate still passes
        gated = api.call("GET", f"releases/{v2_soaking['id']}/")
        gate = json.dumps(gated["gate_status"])
        assert gated["state"] == "active", gate
        assert gated["gate_status"]["failures"] == [], gate
        assert gated["gate_status"]["figures"]["restarts_per_device"] == 0, gate
        assert gated["gate_status"]["figures"]["devices_pinned_away"] == 1, gate

        # paused, the release stops spreading but keeps the devices it reached: unpinned, device 0
        # goes back to v2 (not to an older release's version)
        s.act(v2_soaking, "pause")

        started = time.monotonic()
        s.pin(0, None)
        s.expect("device 0 unpinned", started, everyone("v2"))
        assert json.loads((s.state_dir(0) / "assignment.json").read_text())["counter"] > counter
        assert api.call("GET", f"releases/{v2_soaking['id']}/")["state"] == "paused"

        history = ["v1", "v2", "v1", "v2", "v1", "v3", "v2"]
        assert _versions_run(environment["FERRY_DATABASE_URL"], s.device_id(0)) == [*history, "v1", "v2"]
        for i in (1, 2):
            assert _versions_run(environment["FERRY_DATABASE_URL"], s.device_id(i)) == history
        for i in range(AGENTS):  # nothing was refused on the way
            refused = s.state_dir(i) / "refused.json"
            assert not refused.exists() or json.loads(refused.read_text()) == {}, refused.read_text()
        print("time from action to all three agents running it:")
        for what, seconds in s.timings:
            print(f"  {what:<40} {seconds:5.1f} s")
    finally:
        codes = stack.stop()
    assert all(code in (0, -15) for name, code in codes.items() if name.startswith("agent")), codes
