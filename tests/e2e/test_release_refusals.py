"""Refusals are visible, with real processes: web, Celery worker and beat, the gRPC gateway and
three real agents, everything read through the REST API.

A version signed for another device class is released to the fleet: the one agent of that
class installs it, the two others refuse it. Within a check-in the release shows both
refusals per device with their reason; the gate counts them as failures and aborts the
release, with the reason on it, and the device that had moved goes back to v1.

The gate is evaluated here through the API (as beat does), once both refusals are in. With
beat evaluating it every second the test raced: a refusal is evidence enough to abort, so
the first refusal could abort the release before the second generic agent had even been
offered v2 (its check-in, or its hint, came after the abort), and that agent, never offered
v2, never refused it; the test then waited for a refusal that could not come.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ferry_cloud.stack import RestClient, Stack, free_port

from converter.samples import build_image_classifier
from tests.e2e.fleet_stack import release_environment, running, start_agents
from tests.e2e.helpers import bootstrap_admin, manage_shell, wait_until

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"fleet": "e2e"}
CHECKIN_SECONDS = 2

pytestmark = [pytest.mark.slow, pytest.mark.services]


# The REST API offers no device-class option yet: the version is made by the registry's own
# service, and converted and signed by the running worker like any other.
FOR_ANOTHER_CLASS = """
import io, json, os
from registry.models import Model
from registry.services import version_upload
data = open(os.environ["E2E_ONNX_FILE"], "rb").read()
model = Model.objects.get(pk=int(os.environ["E2E_MODEL_ID"]))
version = version_upload(model=model, label="v2-jetson", stream=io.BytesIO(data), size=len(data),
                         options={"device_class": "jetson"})
result({"id": str(version.pk)})
"""


@pytest.fixture
def environment(tmp_path: Path):
    # beat never evaluates the gate during the test (an hour): the test does, when it should
    with release_environment(
        tmp_path, "ferry_refusals", checkin_seconds=CHECKIN_SECONDS, gate_seconds=3600
    ) as environment:
        yield environment


def _statuses(api: RestClient, release_id: str) -> dict[str, dict]:
    return {d["device_name"]: d for d in api.call("GET", f"releases/{release_id}/devices/")["results"]}


def test_refusing_devices_show_their_reason_and_abort_the_release(environment, tmp_path: Path):
    env = {**os.environ, **environment}
    token = bootstrap_admin(env, "Refusals E2E")
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port = free_port(), free_port()
    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(build_image_classifier().SerializeToString())
    try:
        stack.start_control_plane(http_port, gateway_port)
        api = RestClient(f"http://127.0.0.1:{http_port}", token)
        model = api.call("POST", "models/", json={"name": "classifier"})
        files = {"file": ("model.onnx", onnx_file.read_bytes())}
        v1 = api.call("POST", f"models/{model['id']}/versions/", files=files, data={"label": "v1"})["id"]
        more = {"E2E_MODEL_ID": str(model["id"]), "E2E_ONNX_FILE": str(onnx_file)}
        v2 = manage_shell({**env, **more}, FOR_ANOTHER_CLASS)["id"]
        wait_until(
            "both versions converted",
            lambda: all(api.call("GET", f"versions/{v}/")["status"] == "ready" for v in (v1, v2)),
            stack,
            timeout=90,
        )
        api.call(
            "POST",
            "releases/",
            json={
                "name": "v1",
                "version": v1,
                "target": {"labels": LABELS},
                "start": True,
                "allow_empty": True,
            },
        )
        start_agents(stack, api, gateway_port, tmp_path, LABELS)
        wait_until("three agents on v1", lambda: list(running(api).values()) == ["v1"] * 3, stack, timeout=60)

        release = api.call(
            "POST",
            "releases/",
            json={"name": "v2 for jetson", "version": v2, "target": {"labels": LABELS}, "start": True},
        )
        started = time.monotonic()
        refused = wait_until(
            "both generic agents' refusals on the release",
            lambda: (
                (s := _statuses(api, release["id"]))
                and [s.get(f"agent-{i}", {}).get("state") for i in (1, 2)] == ["refused", "refused"]
                and s
            ),
            stack,
        )
        # the refusal reaches the control plane at the check-in after the one that offered v2
        # (download + verify happen in between): two intervals and some slack for the download
        assert time.monotonic() - started < 4 * CHECKIN_SECONDS + 6
        for name in ("agent-1", "agent-2"):
            row = refused[name]
            assert row["reason_code"] == "wrong_device_class", row
            assert "jetson" in row["message"] and "generic" in row["message"], row
            assert row["reported_at"] and row["updated_at"]

        assert api.call("GET", f"releases/{release['id']}/")["state"] == "active"  # no gate ran yet
        gate = api.call("POST", f"releases/{release['id']}/gate/")
        assert gate["step"] == "abort", gate
        aborted = api.call("GET", f"releases/{release['id']}/")
        assert aborted["state"] == "aborted", aborted
        abort = next(e for e in aborted["events"] if e["action"] == "abort")
        assert abort["actor"] is None
        assert "refused or failed the update (wrong_device_class: 2)" in abort["reason"]
        audited = {e["reason"].split(":")[0] for e in aborted["events"] if e["action"] == "device_refused"}
        assert audited == {"device agent-1", "device agent-2"}
        assert aborted["devices"]["by_state"].get("refused") == 2

        # the jetson agent had installed v2: the abort sends it back; nobody stays on v2
        wait_until("every agent on v1 again", lambda: list(running(api).values()) == ["v1"] * 3, stack)
        refused_only = api.call("GET", f"releases/{release['id']}/devices/", params={"state": "refused"})
        assert refused_only["count"] == 2
    finally:
        codes = stack.stop()
    assert all(code in (0, -15) for name, code in codes.items() if name.startswith("agent")), codes
