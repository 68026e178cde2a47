"""`ferry-agent serve-llm` in a real subprocess: a tiny checkpoint converted and signed, served,
and called over plain HTTP; the greedy answer is the engine's own, streamed or not; every bad
request gets a 4xx in OpenAI's error shape and the server keeps answering."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from converter.llm.convert import convert_llm
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from engine.llm.generate import generate
from engine.llm.package import load_model
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer
from tests.engine.llm.checkpoints import write_checkpoint

pytestmark = pytest.mark.slow
CONTEXT = 96
MESSAGES = [
    {"role": "system", "content": "You are the ferry."},
    {"role": "user", "content": "When does the ferry leave?"},
]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llm")
    write_checkpoint(root / "ckpt", "qwen2", max_position_embeddings=CONTEXT)
    convert_llm(root / "ckpt", root / "tiny.ferry", weights="int8")
    keys = generate_keypair()
    sign_package(root / "tiny.ferry", root / "tiny-signed.ferry", keys.private_key)
    (root / "release.pub").write_text(keys.public_key.hex())
    (root / "other.pub").write_text(generate_keypair().public_key.hex())
    verify_and_unpack(root / "tiny-signed.ferry", root / "unpacked", keys.public_key)
    return {
        "unsigned": root / "tiny.ferry",
        "signed": root / "tiny-signed.ferry",
        "key": root / "release.pub",
        "other_key": root / "other.pub",
        "unpacked": root / "unpacked",
    }


def _serve(package: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "serve-llm", str(package), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def server(packages: dict[str, Path]) -> Iterator[str]:
    process = _serve(packages["signed"], "--public-key", str(packages["key"]), "--model-name", "tiny")
    try:
        line = process.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        assert found, f"no address in {line!r}; stderr: {process.stderr.read() if process.poll() else ''}"
        yield found.group(1)
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0


def _call(base: str, path: str, body: bytes | dict | None = None) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read().decode()
            status, kind = response.status, response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    return status, (json.loads(raw) if kind.startswith("application/json") else raw)


def _direct(unpacked: Path, max_tokens: int, messages: list[dict] = MESSAGES) -> tuple[str, list[int], str]:
    """The engine's own greedy generation (one thread) for ``messages``, the template rendered
    independently."""
    model, tokenizer = load_model(unpacked), LlmTokenizer.from_directory(unpacked)
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        tokenizer.chat_template
    )
    prompt = tokenizer.encode(template.render(messages=messages, add_generation_prompt=True))
    result = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=max_tokens,
        options=SamplingOptions(temperature=0),
        stop_tokens=[0],
    )
    return result.text, prompt, result.finish_reason


def test_a_chat_answer_is_the_engines_greedy_generation(server: str, packages: dict[str, Path]) -> None:
    text, prompt, reason = _direct(packages["unpacked"], 12)
    status, body = _call(
        server,
        "/v1/chat/completions",
        {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "temperature": 0},
    )
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == reason
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert 1 <= body["usage"]["completion_tokens"] <= 12
    status, models = _call(server, "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]


def test_a_streamed_answer_joins_to_the_same_text(server: str, packages: dict[str, Path]) -> None:
    text, _, reason = _direct(packages["unpacked"], 12)
    status, raw = _call(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True},
    )
    assert status == 200
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == reason


def test_seeded_sampling_is_reproducible(server: str) -> None:
    ask = {"messages": MESSAGES, "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    first, second = _call(server, "/v1/chat/completions", ask), _call(server, "/v1/chat/completions", ask)
    assert first[0] == second[0] == 200
    assert first[1]["choices"][0]["message"] == second[1]["choices"][0]["message"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        ({"messages": []}, 400, "invalid_value"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
        ({"messages": MESSAGES, "model": "gpt-4"}, 404, "model_not_found"),
        ({"messages": MESSAGES, "temperature": -1}, 400, "invalid_value"),
        ({"messages": MESSAGES, "max_tokens": 0}, 400, "invalid_value"),
        ({"messages": MESSAGES, "stop": [1]}, 400, "invalid_value"),
        ({"messages": MESSAGES, "max_tokens": CONTEXT}, 400, "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "ferry " * 400}]}, 400, "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}, 413, "too_large"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_reason(
    server: str, body: bytes | dict, status: int, code: str
) -> None:
    got, answer = _call(server, "/v1/chat/completions", body)
    assert got == status, answer
    assert answer["error"]["code"] == code and answer["error"]["message"]
    # and the server keeps answering
    assert _call(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})[0] == 200


def test_unknown_endpoints_are_404(server: str) -> None:
    status, answer = _call(server, "/v1/completions", {"prompt": "x"})
    assert status == 404 and answer["error"]["code"] == "not_found"


def test_an_unsigned_archive_serves_checked_and_a_wrong_key_is_refused(packages: dict[str, Path]) -> None:
    process = _serve(packages["unsigned"])
    try:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", process.stdout.readline())
        assert found
        status, models = _call(found.group(1), "/v1/models")
        assert status == 200 and models["data"][0]["id"] == "tiny"
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert "signature is not" in process.stderr.read()
    refused = _serve(packages["signed"], "--public-key", str(packages["other_key"]))
    assert refused.wait(timeout=60) == 2
    assert "refused" in refused.stderr.read()
    missing = _serve(packages["unpacked"] / "nothing-here")
    assert missing.wait(timeout=60) == 2
    assert "no such package" in missing.stderr.read()


@pytest.mark.parametrize("tier", ["jit", "aot"])
def test_two_threads_answer_a_long_prompt_as_one_thread_does(packages: dict[str, Path], tier: str) -> None:
    """``--threads 2``: the prompt long enough to be prefilled in parts over both threads and
    every decode step shared by them (engine/llm/model.py, spread.py), from the server's request
    thread; the answer is the one-thread engine's.  ``aot``: serve-llm as shipped (FERRY_LLM_AOT
    unset): activation builds the kernels ahead of time and the server never maps LLVM."""
    pier = "The ferry leaves the north pier at seven, calls at the island, and is back by noon. "
    messages = [{"role": "system", "content": pier}, *MESSAGES[1:]]
    text, prompt, reason = _direct(packages["unpacked"], 12, messages)
    assert 64 <= len(prompt) <= CONTEXT - 12  # parts need 64 rows; the reply fits the context
    env = dict(os.environ, FERRY_LLM_AOT="0")
    if tier == "aot":
        del env["FERRY_LLM_AOT"]  # the default
    process = _serve(packages["unsigned"], "--threads", "2", "--model-name", "tiny", env=env)
    try:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", process.stdout.readline())
        assert found, process.stderr.read() if process.poll() is not None else "no address"
        for _ in range(2):  # the second request reuses the cached prompt prefix
            body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}
            status, answer = _call(found.group(1), "/v1/chat/completions", body)
            assert status == 200, answer
            assert answer["choices"][0]["message"]["content"] == text
            assert answer["choices"][0]["finish_reason"] == reason
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert ("llvmlite" in maps) == (tier == "jit")  # numba's LLVM, or the extension instead
        assert ("ferry_llm_aot_" in maps) == (tier == "aot")
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0
