"""LoRA adapters behind the chat API: `ferry-agent serve-llm --adapter NAME=PACKAGE` (a real
subprocess) serves the base and several adapters at once, chosen per request by ``model``; each
answer is the engine's own greedy generation with that adapter; an unknown model is a 404; an
adapter converted for another base is refused at start-up."""

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

from agent.llm_api.chat_request import ChatRequest
from agent.llm_api.errors import ApiError
from agent.llm_api.service import LlmService
from converter.llm.convert import convert_llm
from converter.llm.lora import convert_lora
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from engine.llm.generate import generate
from engine.llm.lora import AdapterError, load_adapter
from engine.llm.package import load_model
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer
from tests.agent.llm.http import request_json
from tests.engine.llm.checkpoints import write_checkpoint, write_peft

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "When does the ferry leave?"}]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    config, _ = write_checkpoint(root / "ckpt", "llama", max_position_embeddings=96)
    write_checkpoint(root / "other", "llama", seed=5, max_position_embeddings=96)
    keys = generate_keypair()
    found = {}
    for name in ("ckpt", "other"):
        convert_llm(root / name, root / f"{name}.ferry", weights="int8")
        sign_package(root / f"{name}.ferry", root / f"{name}-signed.ferry", keys.private_key)
        verify_and_unpack(root / f"{name}-signed.ferry", root / f"{name}-unpacked", keys.public_key)
    for seed, name in ((1, "pirate"), (2, "poet")):
        write_peft(root / name, config, seed=seed, alpha=16.0)
        convert_lora(root / name, root / "ckpt.ferry", root / f"{name}.ferry")
        found[name] = root / f"{name}.ferry"
    convert_lora(root / "pirate", root / "other.ferry", root / "stranger.ferry")
    (root / "release.pub").write_text(keys.public_key.hex())
    return found | {
        "base": root / "ckpt.ferry",
        "unpacked": root / "ckpt-unpacked",
        "stranger": root / "stranger.ferry",
        "root": root,
    }


def _unpacked_adapter(package: Path, dest: Path) -> Path:
    import tarfile  # noqa: PLC0415

    with tarfile.open(package) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _direct(packages: dict[str, Path], adapter_name: str | None, tokens: int) -> str:
    unpacked = packages["unpacked"]
    model, tokenizer = load_model(unpacked), LlmTokenizer.from_directory(unpacked)
    adapter = None
    if adapter_name:
        directory = _unpacked_adapter(packages[adapter_name], packages["root"] / f"direct-{adapter_name}")
        adapter = load_adapter(directory, model.config)
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = environment.from_string(tokenizer.chat_template).render(
        messages=MESSAGES, add_generation_prompt=True
    )
    result = generate(
        model,
        tokenizer,
        tokenizer.encode(text),
        max_tokens=tokens,
        options=SamplingOptions(temperature=0),
        stop_tokens=[0],
        adapter=adapter,
    )
    return result.text


@pytest.fixture(scope="module")
def server(packages: dict[str, Path]) -> Iterator[str]:
    command = [sys.executable, "-m", "agent.cli", "serve-llm", str(packages["base"]), "--port", "0"]
    command += ["--model-name", "tiny", "--adapter", f"pirate={packages['pirate']}"]
    command += ["--adapter", f"poet={packages['poet']}"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        line = process.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        assert found, f"no address in {line!r}; stderr: {process.stderr.read() if process.poll() else ''}"
        yield found.group(1)
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0


def _chat(base: str, model: str, tokens: int = 10) -> tuple[int, dict]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0}
    return request_json(base + "/v1/chat/completions", body)


def test_the_base_and_each_adapter_answer_by_model_name(server: str, packages: dict[str, Path]) -> None:
    with urllib.request.urlopen(server + "/v1/models", timeout=30) as response:
        models = json.loads(response.read())
    assert [m["id"] for m in models["data"]] == ["tiny", "pirate", "poet"]
    answers = {}
    for model in ("tiny", "pirate", "poet"):
        status, body = _chat(server, model)
        assert status == 200, body
        assert body["model"] == model
        answers[model] = body["choices"][0]["message"]["content"]
        assert answers[model] == _direct(packages, None if model == "tiny" else model, 10)
    assert len(set(answers.values())) == 3  # three different models answered


def test_an_unknown_model_is_a_404_naming_what_is_served(server: str) -> None:
    status, body = _chat(server, "pilot")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert "'tiny', 'pirate', 'poet'" in body["error"]["message"]


def test_an_adapter_for_another_base_is_refused_at_start(packages: dict[str, Path]) -> None:
    command = [sys.executable, "-m", "agent.cli", "serve-llm", str(packages["base"]), "--port", "0"]
    command += ["--adapter", f"stranger={packages['stranger']}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "adapter made for base" in result.stderr and "convert it against this base" in result.stderr


def test_an_adapter_name_may_not_shadow_the_base(packages: dict[str, Path], tmp_path: Path) -> None:
    directory = _unpacked_adapter(packages["pirate"], tmp_path / "pirate")
    service = LlmService(packages["unpacked"], name="tiny", adapters={"pirate": directory})
    with pytest.raises(ValueError, match="model name 'tiny' is taken"):
        service.add_adapter("tiny", directory)
    with pytest.raises(AdapterError):
        service.add_adapter("again", tmp_path / "nothing")
    with pytest.raises(ApiError):
        service.complete(ChatRequest(messages=MESSAGES, model="pilot", max_tokens=2))
