"""LoRA adapters released to a device (a real agent process, updated through the gateway double):
an adapter version downloads only its small package, installs beside the active base (which
stays `current`), several adapters are served at once and chosen per request by model name, each
adapter's requests and tokens reach the telemetry under its own version; an adapter made for
another base is refused as incompatible with nothing changed; a rollback to the base is taken
without a download and removes the adapter it goes back from; a restart serves them again."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from converter.llm.convert import convert_llm
from converter.llm.lora import convert_lora
from deploy.package import SignedClaims, generate_keypair, sign_package
from deploy.package.manifest import canonical_json
from deploy.package.writer import write_archive
from tests.agent.double import ORGANISATION_ID, AgentProcess, GatewayDouble, read_state, serve, wait_for
from tests.agent.llm.http import request_json
from tests.agent.llm.test_agent_serves_llm import _free_port as free_port
from tests.engine.llm.checkpoints import write_checkpoint, write_peft

pytestmark = pytest.mark.slow

KEYS = generate_keypair()


def _signed(unsigned: Path, dst: Path, name: str = "") -> Path:
    """Sign for the double's organisation; ``name`` stamped as metadata.name as the control plane does."""
    if name:
        with tarfile.open(unsigned) as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
        manifest = json.loads(members[0][1])
        manifest["metadata"]["name"] = name
        members[0] = (members[0][0], canonical_json(manifest))
        unsigned = unsigned.with_name(unsigned.name + ".named")
        write_archive(unsigned, members)
    sign_package(unsigned, dst, KEYS.private_key, SignedClaims(organisation=ORGANISATION_ID))
    return dst


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fleet-adapters")
    config, _ = write_checkpoint(root / "ckpt", "qwen2", max_position_embeddings=64)
    write_checkpoint(root / "other-ckpt", "qwen2", seed=5, max_position_embeddings=64)
    convert_llm(root / "ckpt", root / "base.ferry", weights="int8")
    convert_llm(root / "other-ckpt", root / "other.ferry", weights="int8")
    found = {"base": _signed(root / "base.ferry", root / "base-signed.ferry")}
    for name, seed, base in (("pirate", 1, "base"), ("poet", 2, "base"), ("stranger", 3, "other")):
        write_peft(root / f"peft-{name}", config, seed=seed)
        convert_lora(root / f"peft-{name}", root / f"{base}.ferry", root / f"{name}.ferry")
        found[name] = _signed(root / f"{name}.ferry", root / f"{name}-signed.ferry", name=name)
    # a newer version of the pirate adapter (other weights, the same name)
    found["pirate-2"] = _signed(root / "poet.ferry", root / "pirate-2-signed.ferry", name="pirate")
    return found


def _request(port: int, path: str, body: dict | None = None) -> tuple[int, dict]:
    return request_json(f"http://127.0.0.1:{port}{path}", body)


def _chat(port: int, model: str) -> tuple[int, dict]:
    ask = {
        "model": model,
        "messages": [{"role": "user", "content": "Ahoy"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    return _request(port, "/v1/chat/completions", ask)


def _served(port: int) -> list[str]:
    try:
        status, body = _request(port, "/v1/models")
    except OSError:  # not listening yet
        return []
    return [m["id"] for m in body.get("data", [])] if status == 200 else []


def test_adapters_install_beside_the_base_and_are_served_by_name(tmp_path: Path, packages) -> None:
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    llm_port = free_port()
    state_dir = tmp_path / "state"
    agent = AgentProcess(state_dir, port, extra=["--llm-port", str(llm_port)])
    try:
        double.publish(packages["base"], "v-base")
        wait_for(lambda: read_state(state_dir)["running"] == "v-base", 90, "the base running", agent)
        wait_for(lambda: _served(llm_port), 60, "the chat API answering", agent)
        downloads = len(double.download_offsets)

        double.publish(packages["pirate"], "v-pirate")
        wait_for(lambda: "pirate" in _served(llm_port), 90, "pirate served", agent)
        state = read_state(state_dir)
        assert state["running"] == "v-pirate" and state["current"] == "v-base"  # beside, not instead
        # one download, of the adapter alone: no base weights travelled or were unpacked again
        assert double.download_offsets[downloads:] == [0]
        unpacked = {p.name for p in (state_dir / "versions" / "v-pirate").iterdir()}
        assert "adapter.bin" in unpacked and "weights.bin" not in unpacked

        double.publish(packages["poet"], "v-poet")
        wait_for(lambda: "poet" in _served(llm_port), 90, "poet served", agent)
        assert sorted(_served(llm_port)) == ["pirate", "poet", "v-base"]
        answers = {}
        for model in ("pirate", "poet"):
            status, body = _chat(llm_port, model)
            assert status == 200, body
            assert body["model"] == model and body["usage"]["completion_tokens"] >= 1
            answers[model] = body["choices"][0]["message"]["content"]
        status, body = _chat(llm_port, "nobody")
        assert status == 404 and body["error"]["code"] == "model_not_found"

        # a metrics record may have been taken between pirate's load and the chat: count them all
        def pirate_records() -> list[dict]:
            return [m for m in double.metrics() if m.get("adapter") == "pirate"]

        wait_for(
            lambda: sum(m.get("llm_requests", 0) for m in pirate_records()) >= 1,
            30,
            "pirate's own metrics record",
            agent,
        )
        records = pirate_records()
        assert all(m["version"] == "v-pirate" and m["base_version"] == "v-base" for m in records)
        assert sum(m["llm_requests"] for m in records) == 1
        assert sum(m["llm_tokens_generated"] for m in records) >= 1
        assert sum(m["llm_errors"] for m in records) == 0

        double.publish(packages["stranger"], "v-stranger")
        refusal = wait_for(
            lambda: next((a for a in double.activations() if a["version_id"] == "v-stranger"), None),
            90,
            "the stranger adapter's refusal",
            agent,
        )
        assert refusal["ok"] is False and refusal["code"] == "incompatible", refusal
        assert "bound to base weights" in refusal["reason"]
        assert read_state(state_dir)["running"] == "v-poet" and "stranger" not in _served(llm_port)
        assert not (state_dir / "versions" / "v-stranger").exists()  # nothing of it kept
        assert _chat(llm_port, "pirate")[1]["choices"][0]["message"]["content"] == answers["pirate"]

        downloads = len(double.download_offsets)
        double.publish(packages["base"], "v-base", rollback=True)  # poet's release rolled back
        wait_for(lambda: read_state(state_dir)["running"] == "v-base", 60, "back on the base", agent)
        wait_for(lambda: "poet" not in _served(llm_port), 30, "poet removed", agent)
        assert "pirate" in _served(llm_port) and len(double.download_offsets) == downloads
        installed = json.loads((state_dir / "adapters.json").read_text())
        assert sorted(installed) == ["pirate"] and installed["pirate"]["version_id"] == "v-pirate"

        agent.stop()  # a restart serves the base and its adapter again, from the state directory
        agent = AgentProcess(state_dir, port, extra=["--llm-port", str(llm_port)])
        wait_for(lambda: "pirate" in _served(llm_port), 90, "pirate served after a restart", agent)
        assert _chat(llm_port, "pirate")[1]["choices"][0]["message"]["content"] == answers["pirate"]
        assert read_state(state_dir)["running"] == "v-base" and len(double.download_offsets) == downloads
    finally:
        agent.stop()
        server.stop(grace=None)


def test_a_rollback_while_the_adapter_is_in_probation_removes_it(tmp_path: Path, packages) -> None:
    """The rollback reaches the device before the adapter's probation ends: the base is switched
    to again through the whole update path, and the adapter still goes."""
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    llm_port = free_port()
    state_dir = tmp_path / "state"
    extra = ["--llm-port", str(llm_port), "--probation-seconds", "600"]  # the last one counts
    agent = AgentProcess(state_dir, port, extra=extra)
    try:
        double.publish(packages["base"], "v-base")
        wait_for(lambda: read_state(state_dir)["running"] == "v-base", 90, "the base running", agent)
        double.publish(packages["pirate"], "v-pirate")
        wait_for(lambda: "pirate" in _served(llm_port), 90, "pirate served", agent)
        wait_for(lambda: read_state(state_dir)["update"] == "probation", 30, "pirate in probation", agent)

        double.publish(packages["base"], "v-base", rollback=True)
        wait_for(lambda: read_state(state_dir)["running"] == "v-base", 60, "back on the base", agent)
        wait_for(lambda: "pirate" not in _served(llm_port), 30, "pirate removed", agent)
        assert json.loads((state_dir / "adapters.json").read_text()) == {}
        assert _chat(llm_port, "v-base")[0] == 200  # the base still answers
    finally:
        agent.stop()
        server.stop(grace=None)


def test_an_adapter_that_crash_loops_in_probation_gives_its_name_back(tmp_path: Path, packages) -> None:
    """pirate v2 replaces pirate v1, then the agent dies three times within v2's probation: the
    device rolls back to v1 (kept on disk until v2 settles), serves it again without a download
    and reports the rollback to v1, not to the bare base."""
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    llm_port = free_port()
    state_dir = tmp_path / "state"
    extra = ["--llm-port", str(llm_port), "--probation-seconds", "600"]
    agent = AgentProcess(state_dir, port, extra=extra)
    try:
        double.publish(packages["base"], "v-base")
        wait_for(lambda: read_state(state_dir)["running"] == "v-base", 90, "the base running", agent)
        double.publish(packages["pirate"], "v-pirate")
        wait_for(lambda: "pirate" in _served(llm_port), 90, "pirate v1 served", agent)
        v1_answer = _chat(llm_port, "pirate")[1]["choices"][0]["message"]["content"]

        double.publish(packages["pirate-2"], "v-pirate-2")
        wait_for(lambda: read_state(state_dir)["running"] == "v-pirate-2", 90, "pirate v2 running", agent)

        def v2_answers() -> bool:  # the service reloads its adapters just after the switch
            status, body = _chat(llm_port, "pirate") if _served(llm_port) else (0, {})
            return status == 200 and body["choices"][0]["message"]["content"] != v1_answer

        wait_for(v2_answers, 60, "pirate v2 answering", agent)
        wait_for(lambda: read_state(state_dir)["update"] == "probation", 30, "v2 in probation", agent)
        downloads = len(double.download_offsets)
        for death in (1, 2, 3):  # three unclean deaths within v2's probation
            agent.kill()
            agent = AgentProcess(state_dir, port, extra=extra)
            agent.wait_log(f"resuming in probation after an unclean stop ({death})")

        wait_for(lambda: read_state(state_dir)["running"] == "v-pirate", 60, "back on pirate v1", agent)
        wait_for(lambda: "pirate" in _served(llm_port), 90, "pirate served again", agent)
        assert _chat(llm_port, "pirate")[1]["choices"][0]["message"]["content"] == v1_answer
        installed = json.loads((state_dir / "adapters.json").read_text())
        assert installed["pirate"]["version_id"] == "v-pirate" and "replaces" not in installed["pirate"]
        assert read_state(state_dir)["current"] == "v-base" and len(double.download_offsets) == downloads
        failed = [a for a in double.activations() if a["version_id"] == "v-pirate-2" and not a["ok"]]
        assert failed and "crash loop" in failed[-1]["reason"] and failed[-1]["rolled_back_to"] == "v-pirate"
        assert not (state_dir / "versions" / "v-pirate-2").exists()  # the failed version's files go
    finally:
        agent.stop()
        server.stop(grace=None)
