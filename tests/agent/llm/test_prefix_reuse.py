"""The chat service keeps its KV cache across requests: a shared system prompt is prefilled once
(usage and the agent's figures say how many tokens were reused) and the answer is the fresh
one; the KV cache's storage comes from ``serve-llm --kv-int8``, the environment or the package;
a request past the context is a 400 saying so."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agent.llm_api.chat_request import ChatRequest
from agent.llm_api.errors import ApiError
from agent.llm_api.service import KV_CACHE_ENV, LlmService
from agent.llm_api.standalone import open_package
from converter.llm.convert import convert_llm
from tests.engine.llm.checkpoints import write_checkpoint

CONTEXT = 96
SYSTEM = {"role": "system", "content": "You are the ferry. The ferry leaves the harbour at dawn."}
FIRST = ChatRequest(
    messages=[SYSTEM, {"role": "user", "content": "When does it leave?"}], max_tokens=4, temperature=0
)
SECOND = dataclasses.replace(FIRST, messages=[SYSTEM, {"role": "user", "content": "Where is the island?"}])


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm")
    write_checkpoint(root / "ckpt", "qwen2", max_position_embeddings=CONTEXT)
    convert_llm(root / "ckpt", root / "tiny.ferry", weights="int8")
    return root / "tiny.ferry"


@pytest.fixture(scope="module")
def unpacked(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return open_package(archive, tmp_path_factory.mktemp("unpacked"))


def _shared(service: LlmService) -> int:
    first, second = (service.prompt_tokens(r.messages) for r in (FIRST, SECOND))
    return next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_a_shared_system_prompt_is_prefilled_once_and_the_answer_is_a_fresh_ones(
    unpacked: Path, kind: str
) -> None:
    from telemetry.schema import validate_record

    service = LlmService(unpacked, name="tiny", kv_cache=kind)
    shared = _shared(service)
    assert shared >= 10  # the system prompt's tokens at least
    first, second = service.complete(FIRST), service.complete(SECOND)
    assert first.body()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second.body()["usage"]["prompt_tokens_details"] == {"cached_tokens": shared}
    fresh = LlmService(unpacked, name="tiny", kv_cache=kind).complete(SECOND)
    assert second.text == fresh.text and fresh.cached_tokens == 0
    figures = service.take_figures()
    assert figures["llm_prefix_tokens_reused"] == shared
    assert figures["llm_prompt_tokens"] == first.prompt_tokens + second.prompt_tokens
    record = validate_record(
        seq=1, kind="metrics", timestamp=1e9, version_id="v", payload_json=json.dumps(figures), now=1e9
    )
    assert record.payload["llm_prefix_tokens_reused"] == shared


def test_the_kv_cache_kind_comes_from_the_argument_the_environment_or_the_package(
    unpacked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KV_CACHE_ENV, raising=False)
    assert LlmService(unpacked).generator.cache.kind == "fp32"
    declared = shutil.copytree(unpacked, tmp_path / "declared")
    manifest = json.loads((declared / "manifest.json").read_text())
    manifest["metadata"]["llm"]["kv_cache"] = "int8"
    (declared / "manifest.json").write_text(json.dumps(manifest))
    assert LlmService(declared).kv_cache == "int8"
    monkeypatch.setenv(KV_CACHE_ENV, "fp32")  # the device's choice wins over the package's
    assert LlmService(declared).generator.cache.kind == "fp32"
    assert LlmService(declared, kv_cache="int8").generator.cache.kind == "int8"
    monkeypatch.setenv(KV_CACHE_ENV, "int3")
    with pytest.raises(ValueError, match="KV cache 'int3' is not one of fp32, int8"):
        LlmService(unpacked)


def test_a_request_past_the_context_is_a_400_and_one_at_the_limit_ends_by_length(unpacked: Path) -> None:
    service = LlmService(unpacked, name="tiny", kv_cache="int8")
    long = dataclasses.replace(FIRST, messages=[{"role": "user", "content": "the ferry " * 40}])
    prompt = len(service.prompt_tokens(long.messages))
    room = CONTEXT - prompt
    assert 0 < room < 20
    with pytest.raises(ApiError) as refused:
        service.complete(dataclasses.replace(long, max_tokens=room + 1))
    assert refused.value.status == 400 and refused.value.code == "context_length_exceeded"
    assert f"the prompt is {prompt} tokens and {room + 1} more were asked for" in refused.value.message
    filled = service.complete(dataclasses.replace(long, max_tokens=None, stop=()))
    assert filled.prompt_tokens + filled.completion_tokens <= CONTEXT
    assert filled.finish_reason == "stop" or filled.completion_tokens == room


def _post(base: str, request: ChatRequest) -> dict:
    body = {"messages": request.messages, "max_tokens": request.max_tokens, "temperature": 0}
    call = urllib.request.Request(
        base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(call, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_serve_llm_kv_int8_serves_and_reuses_the_prefix_across_requests(archive: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "serve-llm", str(archive), "--port", "0", "--kv-int8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", process.stdout.readline())
        assert found, process.stderr.read() if process.poll() is not None else "no address"
        first, second = _post(found.group(1), FIRST), _post(found.group(1), SECOND)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 10
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0
    assert "KV cache int8" in process.stderr.read()


def test_the_agents_llm_host_serves_with_its_kv_cache_setting(unpacked: Path) -> None:
    from agent.llm_api.host import LlmHost

    host = LlmHost(port=0, kv_cache="int8")
    assert host.load(unpacked, "v1")
    assert host.service.generator.cache.kind == "int8"
    assert host.service.complete(FIRST).completion_tokens >= 1
    assert host.take_figures()["llm_prefix_tokens_reused"] == 0
