"""Staged rollouts with real processes: web, Celery worker and beat (the periodic gate
evaluation), the gRPC gateway and three real agents. Everything goes through the REST API.

A staged release advances phase by phase as the agents' own telemetry passes its gate;
a faulty one (a p95-latency gate it cannot meet, measured on the agents' real figures)
is aborted by the gate and its device installs the previous version again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest
from ferry_cloud.stack import RestClient, Stack, free_port

from converter.samples import build_image_classifier
from deploy.rollout import bucket
from tests.e2e.fleet_stack import release_environment
from tests.e2e.helpers import bootstrap_admin, wait_until

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"fleet": "e2e"}
AGENTS = 3

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture
def environment(tmp_path: Path):
    """A database and a Redis db of its own, local file storage, fast check-ins and gate evaluations."""
    with release_environment(tmp_path, "ferry_rollout", checkin_seconds=2, gate_seconds=1) as environment:
        yield environment


def _upload(api: RestClient, model_id: int, label: str) -> str:
    files = {"file": ("model.onnx", build_image_classifier().SerializeToString())}
    return api.call("POST", f"models/{model_id}/versions/", files=files, data={"label": label})["id"]


def _running(api: RestClient) -> dict[str, str | None]:
    return {
        d["id"]: (d["running_version_info"] or {}).get("label")
        for d in api.call("GET", "devices/")["results"]
    }


def _versions_run(environment: dict[str, str], device_id: str) -> list[str]:
    """The labels of the versions a device began running, in order (the control plane's history)."""
    with psycopg.connect(environment["FERRY_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT v.label FROM fleet_deviceversionchange c JOIN registry_modelversion v "
            "ON v.id = c.to_version_id WHERE c.device_id = %s ORDER BY c.at, c.id",
            (device_id,),
        ).fetchall()
    return [label for (label,) in rows]


SALT = "e2e"
# a phase at p % selects ⌈p·N/100⌉ of the N matching devices, the lowest buckets first: 30 % of
# three devices is exactly one canary, whatever the salt
CANARY_PERCENTAGE = 30


def _canary(device_ids: list[str], salt: str) -> str:
    """The device a one-device first phase selects: the lowest bucket."""
    return min(device_ids, key=lambda d: bucket(salt, d))


def test_staged_release_advances_and_faulty_one_rolls_back(environment, tmp_path: Path):
    env = {**os.environ, **environment}
    token = bootstrap_admin(env, "Rollout E2E")
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port = free_port(), free_port()
    try:
        stack.start_control_plane(http_port, gateway_port)
        api = RestClient(f"http://127.0.0.1:{http_port}", token)
        model = api.call("POST", "models/", json={"name": "classifier"})
        versions = {label: _upload(api, model["id"], label) for label in ("v1", "v2", "v3")}
        wait_until(
            "three converted versions",
            lambda: all(api.call("GET", f"versions/{v}/")["status"] == "ready" for v in versions.values()),
            stack,
            timeout=60,
        )

        # everyone on v1
        api.call(
            "POST",
            "releases/",
            # made before any agent enrols: its target matches no device yet, on purpose
            json={
                "name": "v1",
                "version": versions["v1"],
                "target": {"labels": LABELS},
                "start": True,
                "allow_empty": True,
            },
        )
        for i in range(AGENTS):
            enrolment = api.call("POST", "enrolment-tokens/", json={"labels": LABELS})["token"]
            stack.start_agent(
                f"agent-{i}",
                gateway_port,
                tmp_path / f"agent-{i}",
                enrolment,
                {},
                extra=["--metrics-interval", "1", "--upload-interval", "1"],
            )
        running = wait_until(
            "three agents on v1",
            lambda: (r := _running(api)) and len(r) == AGENTS and set(r.values()) == {"v1"} and r,
            stack,
        )
        salt = SALT

        # a staged release: one canary first, then the whole fleet, each phase through its gate
        staged = api.call(
            "POST",
            "releases/",
            json={
                "name": "v2 staged",
                "version": versions["v2"],
                "target": {"labels": LABELS},
                "salt": salt,
                "phases": [
                    {"percentage": CANARY_PERCENTAGE, "min_soak_seconds": 3, "min_reporting_devices": 1},
                    {"percentage": 100, "min_soak_seconds": 3, "min_reporting_devices": AGENTS},
                ],
                "gate": {"max_latency_p95_ratio": None},
                "start": True,
            },
        )
        canary_phase = wait_until(
            "the canary on v2", lambda: sorted(_running(api).values()) == ["v1", "v1", "v2"], stack
        )
        assert canary_phase
        done = wait_until(
            "the staged release to complete",
            lambda: (r := api.call("GET", f"releases/{staged['id']}/"))["state"] == "completed" and r,
            stack,
        )
        gate_moves = [
            (e["action"], e["from_phase"], e["to_phase"]) for e in done["events"] if e["actor"] is None
        ]
        assert gate_moves == [("advance", 1, 2), ("advance", 2, 2)]
        first = next(e for e in done["events"] if e["actor"] is None)
        assert first["details"]["figures"]["devices_reporting"] == 1  # only the canary had moved
        wait_until("all agents on v2", lambda: set(_running(api).values()) == {"v2"}, stack)

        # a faulty release: its canary cannot meet the latency gate, the gate aborts, the canary goes back
        faulty = api.call(
            "POST",
            "releases/",
            json={
                "name": "v3 faulty",
                "version": versions["v3"],
                "target": {"labels": LABELS},
                "salt": salt,
                "phases": [
                    {"percentage": CANARY_PERCENTAGE, "min_soak_seconds": 5, "min_reporting_devices": 1},
                    {"percentage": 100},
                ],
                "gate": {"max_latency_p95_ratio": 0.01, "on_failure": "abort"},
                "start": True,
            },
        )
        # The canary is known from the salt.  Its time on v3 can be shorter than a poll of the API
        # (the gate acts as soon as it reports), so it is read from the version history below.
        canary = _canary(list(running), salt)
        aborted = wait_until(
            "the gate to abort",
            lambda: (r := api.call("GET", f"releases/{faulty['id']}/"))["state"] == "aborted" and r,
            stack,
        )
        abort = aborted["events"][-1]
        assert abort["action"] == "abort" and abort["actor"] is None
        assert "p95 latency ratio" in abort["reason"]
        # the gate may abort on the canary's v3 metrics before its check-in has said it runs v3, so
        # "everyone on v2" can be read before the canary's v3 arrives: wait for its move back instead
        wait_until(
            "the canary back on v2",
            lambda: (
                _versions_run(environment, canary)[-2:] == ["v3", "v2"]
                and set(_running(api).values()) == {"v2"}
            ),
            stack,
        )
        assert _versions_run(environment, canary) == ["v1", "v2", "v3", "v2"]
        assert all(_versions_run(environment, d) == ["v1", "v2"] for d in running if d != canary)
        state_dir = next(
            tmp_path / f"agent-{i}"
            for i in range(AGENTS)
            if json.loads((tmp_path / f"agent-{i}" / "credential.json").read_text())["device_id"] == canary
        )
        wait_until(
            "the canary's own record of v2",
            lambda: json.loads((state_dir / "running.json").read_text())["version_id"] == versions["v2"],
            stack,
        )
    finally:
        codes = stack.stop()
    assert all(code in (0, -15) for name, code in codes.items() if name.startswith("agent")), codes
