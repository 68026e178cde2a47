"""The agent with ``--llm-port``: activating an LLM version serves its chat API on 127.0.0.1,
reports it as the running version, and puts the API's figures in its metrics records;
activating a non-LLM version (or none) answers 503 instead of serving a stale model."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agent.daemon import Agent, AgentConfig
from agent.files import switch_symlink
from converter.llm.convert import convert_llm
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from tests.agent.llm.http import request_json
from tests.engine.llm.checkpoints import write_checkpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def state_dir(tmp_path: Path) -> Path:
    write_checkpoint(tmp_path / "ckpt", "qwen2", max_position_embeddings=64)
    convert_llm(tmp_path / "ckpt", tmp_path / "m.ferry", weights="int8")
    keys = generate_keypair()
    sign_package(tmp_path / "m.ferry", tmp_path / "s.ferry", keys.private_key)
    state = tmp_path / "state"
    verify_and_unpack(tmp_path / "s.ferry", state / "versions" / "v-llm", keys.public_key)
    return state


def test_the_active_llm_version_is_served_and_measured(state_dir: Path) -> None:
    port = _free_port()
    agent = Agent(AgentConfig(gateway="", state_dir=state_dir, llm_port=port))
    switch_symlink(state_dir / "current", "versions/v-llm")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    ask = {"messages": [{"role": "user", "content": "The ferry"}], "max_tokens": 5, "temperature": 0}
    try:
        agent._load_version("v-llm")
        assert agent.running_version == "v-llm" and agent.inference.version == ""
        status, body = request_json(url, ask)
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
        agent.record_metrics()
        [record] = [r for r in agent.outbox.batch() if r.kind == "metrics"]
        assert record.version_id == "v-llm"
        assert record.payload["llm_requests"] == 1
        assert record.payload["llm_tokens_generated"] == body["usage"]["completion_tokens"]
        agent._load_version("")  # nothing active: the API says so instead of answering
        status, body = request_json(url, ask)
        assert status == 503 and body["error"]["code"] == "no_model"
        assert agent.running_version == ""
    finally:
        agent.llm.stop()
        agent.outbox.close()
