"""An LLM adapter through the whole fleet path, with real processes: web, worker, gateway and a
real agent.  The base LLM and a PEFT adapter trained on it are uploaded and converted by the
worker; the base is released, then the adapter: the device downloads only the adapter, serves it
beside the base under its model name, and its requests reach the control plane as telemetry of
the adapter's version; rolling the adapter's release back leaves the base alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ferry_cloud.stack import RestClient, Stack, free_port

from tests.agent.llm.http import request_json
from tests.e2e.fleet_stack import release_environment
from tests.e2e.helpers import bootstrap_admin, wait_until
from tests.engine.llm.checkpoints import write_checkpoint, write_peft
from tests.platform.registry.test_checkpoint_uploads import tar_of

LABELS = {"fleet": "adapters"}

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture
def environment(tmp_path: Path):
    with release_environment(
        tmp_path, "ferry_adapter_e2e", checkin_seconds=2, gate_seconds=None
    ) as environment:
        yield environment


def _upload(api: RestClient, name: str, archive: bytes, **fields: str) -> dict:
    model = api.call("POST", "models/", json={"name": name})
    files = {"file": (f"{name}.tgz", archive)}
    return api.call("POST", f"models/{model['id']}/versions/", files=files, data={"label": "v1", **fields})


def _ready(api: RestClient, version_id: str) -> bool:
    version = api.call("GET", f"versions/{version_id}/")
    assert version["status"] != "failed", version["job"]["error"]
    return version["status"] == "ready"


def _release(api: RestClient, name: str, version_id: str) -> dict:
    body = {"name": name, "version": version_id, "target": {"labels": LABELS}, "start": True}
    return api.call("POST", "releases/", json={**body, "allow_empty": True})


def _running(api: RestClient) -> str:
    devices = api.call("GET", "devices/")["results"]
    return (devices[0]["running_version_info"] or {}).get("id", "") if devices else ""


def _chat(port: int, model: str) -> tuple[int, dict]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Ahoy"}],
        "max_tokens": 3,
        "temperature": 0,
    }
    try:
        return request_json(f"http://127.0.0.1:{port}/v1/chat/completions", body)
    except OSError:  # not listening (yet, or any more)
        return 0, {}


def _answer(port: int, model: str) -> dict | None:
    status, body = _chat(port, model)
    return body if status == 200 else None


def _adapter_record(api: RestClient, adapter_id: str) -> dict | None:
    device = api.call("GET", "devices/")["results"][0]["id"]
    records = api.call("GET", f"devices/{device}/telemetry/?kind=metrics")["results"]
    return next(
        (r for r in records if r["version_id"] == adapter_id and r["payload"].get("llm_requests")), None
    )


def test_an_adapter_release_ships_the_adapter_alone_and_serves_it_by_name(environment, tmp_path: Path):
    config, _ = write_checkpoint(tmp_path / "tiny", "qwen2", max_position_embeddings=64)
    write_peft(tmp_path / "pirate", config)
    env = {**os.environ, **environment}
    token = bootstrap_admin(env, "Adapter E2E")
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port, llm_port = free_port(), free_port(), free_port()
    try:
        stack.start_control_plane(http_port, gateway_port)
        api = RestClient(f"http://127.0.0.1:{http_port}", token)
        base = _upload(api, "tiny", tar_of(tmp_path / "tiny"), kind="llm", weights="int8")
        wait_until("the base converted", lambda: _ready(api, base["id"]), stack, timeout=180)
        _release(api, "base", base["id"])
        enrolment = api.call("POST", "enrolment-tokens/", json={"labels": LABELS})["token"]
        extra = ["--llm-port", str(llm_port), "--metrics-interval", "1", "--probation-seconds", "2"]
        stack.start_agent("agent-0", gateway_port, tmp_path / "agent-0", enrolment, {}, extra)
        wait_until("the agent on the base", lambda: _running(api) == base["id"], stack, timeout=120)

        adapter = _upload(api, "pirate", tar_of(tmp_path / "pirate"), kind="llm_adapter", base=base["id"])
        wait_until("the adapter converted", lambda: _ready(api, adapter["id"]), stack, timeout=180)
        sizes = {v["id"]: v["package_size"] for v in api.call("GET", "versions/")["results"]}
        assert sizes[adapter["id"]] < sizes[base["id"]] / 2
        release = _release(api, "pirate", adapter["id"])
        wait_until("the agent on the adapter", lambda: _running(api) == adapter["id"], stack, timeout=120)
        state = tmp_path / "agent-0"
        assert os.readlink(state / "current").endswith(base["id"])  # the base stays current
        answer = wait_until("pirate answering", lambda: _answer(llm_port, "pirate"), stack, timeout=60)
        assert answer["model"] == "pirate" and answer["usage"]["completion_tokens"] >= 1

        record = wait_until(
            "pirate's telemetry", lambda: _adapter_record(api, adapter["id"]), stack, timeout=60
        )
        assert record["payload"]["adapter"] == "pirate" and record["payload"]["base_version"] == base["id"]

        api.call("POST", f"releases/{release['id']}/rollback/", json={"reason": "e2e"})
        wait_until("the agent back on the base", lambda: _running(api) == base["id"], stack, timeout=120)
        wait_until("pirate gone", lambda: _chat(llm_port, "pirate")[0] == 404, stack, timeout=60)
        assert _chat(llm_port, "")[0] == 200  # the base still answers
    finally:
        stack.stop()
