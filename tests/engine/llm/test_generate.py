"""Generation with the tokenizer: greedy equals the model's argmax chain, stop strings cut and
never stream, a seed reproduces, a package round-trips the weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.llm.checkpoint import load_checkpoint
from engine.llm.errors import CheckpointError, ContextLimitError, TokenizerError
from engine.llm.generate import generate
from engine.llm.model import LlmModel, weights_from_checkpoint
from engine.llm.package import load_model, serialize
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer
from tests.engine.llm.checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlmModel, LlmTokenizer, Path]:
    directory = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(directory, "qwen2", max_position_embeddings=64)
    checkpoint = load_checkpoint(directory)
    model = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint))
    return model, LlmTokenizer.from_directory(directory), directory


def test_greedy_generation_is_the_argmax_chain_and_streams_the_same_text(llm: tuple) -> None:
    model, tokenizer, _ = llm
    prompt = tokenizer.encode("The ferry leaves the harbour")
    pieces: list[str] = []
    result = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=8,
        options=SamplingOptions(temperature=0),
        stop_tokens=[],
        on_text=pieces.append,
    )
    chain, cache = [], model.new_cache()
    logits = model.forward(prompt, cache)
    for _ in range(8):
        chain.append(int(np.argmax(logits)))
        logits = model.forward(chain[-1:], cache)
    assert result.tokens == chain and result.finish_reason == "length"
    assert "".join(pieces) == result.text == tokenizer.decode(chain)
    assert result.prefill_seconds > 0 and result.time_to_first_token >= result.prefill_seconds


def test_a_stop_string_ends_generation_and_is_never_streamed(llm: tuple) -> None:
    model, tokenizer, _ = llm
    prompt = tokenizer.encode("On the island")
    free = generate(
        model, tokenizer, prompt, max_tokens=12, options=SamplingOptions(temperature=0), stop_tokens=[]
    )
    assert len(free.text) > 4
    stop = free.text[2:5]
    pieces: list[str] = []
    cut = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=12,
        options=SamplingOptions(temperature=0),
        stop_tokens=[],
        stop=[stop],
        on_text=pieces.append,
    )
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.find(stop)]
    assert "".join(pieces) == cut.text and stop not in "".join(pieces)


def test_a_stop_token_ends_generation(llm: tuple) -> None:
    model, tokenizer, _ = llm
    prompt = tokenizer.encode("Passengers drink tea")
    options = SamplingOptions(temperature=0, repetition_penalty=3.0)  # a random model repeats itself
    free = generate(model, tokenizer, prompt, max_tokens=6, options=options, stop_tokens=[])
    at = next(i for i, t in enumerate(free.tokens) if i and t not in free.tokens[:i])
    stopped = generate(model, tokenizer, prompt, max_tokens=6, options=options, stop_tokens=[free.tokens[at]])
    assert stopped.tokens == free.tokens[:at] and stopped.finish_reason == "stop"


def test_seeded_sampling_reproduces_and_the_context_limit_is_checked_first(llm: tuple) -> None:
    model, tokenizer, _ = llm
    prompt = tokenizer.encode("In the evening")
    options = SamplingOptions(temperature=1.0, top_k=20, seed=11)
    first = generate(model, tokenizer, prompt, max_tokens=10, options=options, stop_tokens=[])
    again = generate(model, tokenizer, prompt, max_tokens=10, options=options, stop_tokens=[])
    assert first.tokens == again.tokens
    with pytest.raises(ContextLimitError, match="exceed the context length 64"):
        generate(model, tokenizer, prompt, max_tokens=64, options=options)


def test_the_tokenizer_must_fit_the_embedding(llm: tuple) -> None:
    model, tokenizer, _ = llm
    tokenizer.check_fits(model.config.vocab_size)
    with pytest.raises(TokenizerError, match="past the embedding's 100 rows"):
        tokenizer.check_fits(100)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "int4"])
def test_a_package_maps_the_same_weights(llm: tuple, tmp_path: Path, precision: str) -> None:
    model, _, directory = llm
    checkpoint = load_checkpoint(directory)
    weights = weights_from_checkpoint(checkpoint, precision, 32)
    index, data = serialize(checkpoint.config, weights, precision, 32)
    (tmp_path / "llm.json").write_bytes(index)
    (tmp_path / "weights.bin").write_bytes(data)
    loaded = load_model(tmp_path)
    assert isinstance(loaded.weights.layers[0].qkv.arrays["w" if precision[:2] == "fp" else "q"], np.memmap)
    prompt = [3, 4, 5, 6]
    expected = LlmModel(checkpoint.config, weights).forward(prompt, model.new_cache())
    np.testing.assert_array_equal(loaded.forward(prompt, loaded.new_cache()), expected)


def _package(llm: tuple, directory: Path) -> dict:
    checkpoint = load_checkpoint(llm[2])
    index, data = serialize(checkpoint.config, weights_from_checkpoint(checkpoint, "int4", 32), "int4", 32)
    (directory / "weights.bin").write_bytes(data)
    return json.loads(index)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda i: i["matrices"]["layers.1.down"].update(shape=[64, 48]), "layers.1.down: holds .* wants"),
        (lambda i: i["matrices"]["layers.0.qkv"].update(block=16), "layers.0.qkv: kind 'int4' with block 16"),
        (
            lambda i: i["tensors"]["layers.0.o.scale"].update(shape=[64, 1]),
            r"layers.0.o.scale: <f4\[64, 1\], wants",
        ),
        (lambda i: i["tensors"]["layers.0.o.q"].update(dtype="<f8"), "bad offset, shape or dtype"),
        (lambda i: i["tensors"]["norm"].update(offset=10**9), "'norm' runs past the end"),
        (lambda i: i["tensors"]["norm"].update(offset=3), "bad offset"),
        (lambda i: i["matrices"].pop("embed"), "matrix 'embed' is missing"),
        (lambda i: i["tensors"].pop("layers.1.qkv_bias"), "'layers.1.qkv_bias' is not listed"),
        (lambda i: i["config"].update(hidden_size=32), "wants"),
    ],
)
def test_a_malformed_package_index_is_refused_before_any_kernel_runs(
    llm: tuple, tmp_path: Path, change: Any, message: str
) -> None:
    index = _package(llm, tmp_path)
    change(index)
    (tmp_path / "llm.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=message):
        load_model(tmp_path)
