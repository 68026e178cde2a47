"""A real agent process with ``--llm-port``, updated through the gateway double: an LLM version
passes its self-test, goes live and answers chat requests on 127.0.0.1, its figures reach the
telemetry; a version whose recorded self-test tokens do not regenerate is rolled back, naming
the mismatch, and the previous version keeps answering."""

from __future__ import annotations

import json
import tarfile
import urllib.request
from pathlib import Path

import pytest

from converter.llm.convert import convert_llm
from deploy.package import SignedClaims, generate_keypair, sign_package
from deploy.package.writer import write_archive
from tests.agent.double import ORGANISATION_ID, AgentProcess, GatewayDouble, read_state, serve, wait_for
from tests.agent.llm.test_agent_serves_llm import _free_port as free_port
from tests.engine.llm.checkpoints import write_checkpoint

pytestmark = pytest.mark.slow

KEYS = generate_keypair()
ASK = {"messages": [{"role": "user", "content": "The ferry"}], "max_tokens": 4, "temperature": 0}


def _signed(unsigned: Path, dst: Path, break_selftest: bool = False) -> Path:
    if break_selftest:  # the recorded tokens no longer match what the weights generate
        with tarfile.open(unsigned) as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
        manifest = json.loads(members[0][1])
        tokens = manifest["metadata"]["llm"]["selftest"]["tokens"]
        manifest["metadata"]["llm"]["selftest"]["tokens"] = [(tokens[0] + 1) % 200, *tokens[1:]]
        members[0] = (members[0][0], json.dumps(manifest).encode())
        unsigned = unsigned.with_name(unsigned.name + ".broken")
        write_archive(unsigned, members)
    sign_package(unsigned, dst, KEYS.private_key, SignedClaims(organisation=ORGANISATION_ID))
    return dst


def _answered(port: int) -> dict | None:
    try:
        return _chat(port)
    except OSError:  # not listening yet (the version loads after running.json names it)
        return None


def _chat(port: int) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(ASK).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_an_llm_version_goes_live_answers_and_a_broken_one_rolls_back(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", "qwen2", max_position_embeddings=64)
    convert_llm(tmp_path / "ckpt", tmp_path / "m.ferry", weights="int8")
    v1 = _signed(tmp_path / "m.ferry", tmp_path / "v1.ferry")
    v2 = _signed(tmp_path / "m.ferry", tmp_path / "v2.ferry", break_selftest=True)
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    llm_port = free_port()
    agent = AgentProcess(tmp_path / "state", port, extra=["--llm-port", str(llm_port)])
    state_dir = tmp_path / "state"
    try:
        double.publish(v1, "v1")
        wait_for(lambda: read_state(state_dir)["running"] == "v1", 90, "v1 running", agent)
        first = wait_for(lambda: _answered(llm_port), 60, "the chat API answering", agent)
        assert first["choices"][0]["message"]["role"] == "assistant"
        assert first["usage"]["completion_tokens"] >= 1
        measured = wait_for(
            lambda: next((m for m in double.metrics() if m.get("llm_requests")), None),
            30,
            "the chat request in the metrics",
            agent,
        )
        assert measured["version"] == "v1" and measured["llm_tokens_generated"] >= 1

        double.publish(v2, "v2")
        refusal = wait_for(
            lambda: next((a for a in double.activations() if a["version_id"] == "v2" and not a["ok"]), None),
            90,
            "the rollback of v2 in telemetry",
            agent,
        )
        assert "LLM self-test generated" in refusal["reason"] and refusal["rolled_back_to"] == "v1"
        wait_for(lambda: read_state(state_dir)["current"] == "v1", 30, "v1 current again", agent)
        again = _chat(llm_port)  # the same greedy answer from the same version
        assert again["choices"][0]["message"] == first["choices"][0]["message"]
    finally:
        agent.stop()
        server.stop(grace=None)
