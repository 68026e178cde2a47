"""Compatibility before anything runs, with real processes: web, worker, gateway and a real
agent.  A version whose input does not fit what the agent runs is refused at creation, naming
the mismatch and the device; the same release marked as shipping a new pipeline goes out.

(The other half, a device rolling back a model that fails on its recent real events with the
reason ``incompatible``, is tests/agent/test_incompatible_rollback.py: it needs a package that
carries a stream pipeline, which the converter does not write.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ferry_cloud.stack import RestClient, RestError, Stack, free_port

from converter.samples import build_image_classifier
from tests.e2e.fleet_stack import release_environment
from tests.e2e.helpers import bootstrap_admin, wait_until

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"fleet": "compat"}

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture
def environment(tmp_path: Path):
    with release_environment(
        tmp_path, "ferry_compat_e2e", checkin_seconds=2, gate_seconds=None
    ) as environment:
        yield environment


def _upload(api: RestClient, model_id: int, label: str, **shape) -> str:
    files = {"file": ("model.onnx", build_image_classifier(**shape).SerializeToString())}
    return api.call("POST", f"models/{model_id}/versions/", files=files, data={"label": label})["id"]


def _running(api: RestClient) -> list[str | None]:
    return [(d["running_version_info"] or {}).get("label") for d in api.call("GET", "devices/")["results"]]


def test_an_incompatible_release_is_refused_until_it_ships_a_new_pipeline(environment, tmp_path: Path):
    env = {**os.environ, **environment}
    token = bootstrap_admin(env, "Compat E2E")
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port = free_port(), free_port()
    try:
        stack.start_control_plane(http_port, gateway_port)
        api = RestClient(f"http://127.0.0.1:{http_port}", token)
        model = api.call("POST", "models/", json={"name": "classifier"})
        versions = {
            "rgb": _upload(api, model["id"], "rgb"),
            "grey": _upload(api, model["id"], "grey", channels=1),
        }
        wait_until(
            "two converted versions",
            lambda: all(api.call("GET", f"versions/{v}/")["status"] == "ready" for v in versions.values()),
            stack,
            timeout=90,
        )
        target = {"labels": LABELS}
        api.call(
            "POST",
            "releases/",
            json={
                "name": "rgb",
                "version": versions["rgb"],
                "target": target,
                "start": True,
                "allow_empty": True,
            },
        )
        enrolment = api.call("POST", "enrolment-tokens/", json={"labels": LABELS})["token"]
        stack.start_agent("agent-0", gateway_port, tmp_path / "agent-0", enrolment, {})
        wait_until("the agent on rgb", lambda: _running(api) == ["rgb"], stack, timeout=60)

        grey = {"name": "grey", "version": versions["grey"], "target": target, "start": True}
        with pytest.raises(RestError) as refused:
            api.call("POST", "releases/", json=grey)
        message = str(refused.value)
        assert " 400 " in message and "incompatible_version" in message
        assert "classifier:rgb on 1 device(s)" in message
        assert "input 'image': dim 1 is 1 in the package, 3 on the device" in message
        assert [r["name"] for r in api.call("GET", "releases/")["results"]] == ["rgb"]  # nothing half-made

        shipped = api.call("POST", "releases/", json={**grey, "new_pipeline": True})
        assert shipped["state"] == "active"
        wait_until("the agent on grey", lambda: _running(api) == ["grey"], stack, timeout=60)
    finally:
        stack.stop()
