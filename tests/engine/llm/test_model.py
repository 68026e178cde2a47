"""The LLM runtime's forward against an independent numpy forward of the model's equations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.llm.checkpoint import load_checkpoint
from engine.llm.errors import ContextLimitError
from engine.llm.model import LlmModel, weights_from_checkpoint
from engine.llm.weights import make_matrix
from tests.engine.llm.checkpoints import reference_logits, write_checkpoint

PROMPT = [5, 17, 42, 3, 99, 7, 250, 12, 64]


def _model(directory: Path, precision: str = "fp32", block: int = 32) -> LlmModel:
    checkpoint = load_checkpoint(directory)
    return LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint, precision, block))


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("llama", {}),
        ("qwen2", {}),
        ("mistral", {"head_dim": 8, "sliding_window": 48}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "attention_bias": True}),
    ],
)
def test_prefill_and_every_cached_decode_step_match_the_reference(
    tmp_path: Path, model_type: str, extra: dict
) -> None:
    config, tensors = write_checkpoint(tmp_path, model_type, shards=2, **extra)
    model = _model(tmp_path)
    cache = model.new_cache()
    prefill = model.forward(PROMPT, cache, all_logits=True)
    expected = reference_logits(config, tensors, PROMPT)
    assert prefill.shape == (len(PROMPT), config["vocab_size"])
    np.testing.assert_allclose(prefill, expected, atol=1e-4, rtol=0)
    tokens = list(PROMPT)
    for _ in range(6):  # greedy decode, each step checked against a full recompute
        tokens.append(int(np.argmax(expected[-1])))
        step = model.forward(tokens[-1:], cache)
        expected = reference_logits(config, tensors, tokens)
        np.testing.assert_allclose(step, expected[-1], atol=1e-4, rtol=0)
    assert cache.length == len(tokens)


def test_prefill_in_blocks_equals_prefill_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_checkpoint(tmp_path, "qwen2")
    model = _model(tmp_path)
    whole = model.forward(PROMPT, model.new_cache(), all_logits=True)
    monkeypatch.setattr("engine.llm.model.PREFILL_BLOCK", 4)
    blocks = model.forward(PROMPT, model.new_cache(), all_logits=True)
    np.testing.assert_allclose(blocks, whole, atol=1e-5)


def test_the_cache_refuses_tokens_past_the_context_length_and_keeps_its_state(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, "llama")
    model = _model(tmp_path)
    cache = model.new_cache(context=12)
    model.forward(PROMPT, cache)
    with pytest.raises(ContextLimitError, match="exceed the context length 12 by 1"):
        model.forward([1, 2, 3, 4], cache)
    assert cache.length == len(PROMPT)  # nothing appended by the refused call
    model.forward([1, 2, 3], cache)
    assert cache.length == 12
    with pytest.raises(ContextLimitError, match="context length 100 must be between 1 and the model's 64"):
        model.new_cache(context=100)


def test_a_truncated_cache_reuses_its_prefix(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, "llama")
    model = _model(tmp_path)
    cache = model.new_cache()
    model.forward(PROMPT[:5], cache)
    model.forward([8, 9], cache)
    cache.truncate(5)  # a shared system prompt stays; the rest is forgotten
    reused = model.forward(PROMPT[5:], cache)
    fresh = model.forward(PROMPT, model.new_cache())
    np.testing.assert_allclose(reused, fresh, atol=1e-5)


@pytest.mark.parametrize(("precision", "block"), [("int8", 32), ("int4", 32), ("int4", 64), ("fp16", 32)])
def test_quantized_prefill_and_decode_equal_the_float_forward_of_their_dequantized_weights(
    tmp_path: Path, precision: str, block: int
) -> None:
    """The GEMV kernels (JIT when numba is on) and the tiled GEMMs compute exactly the stored
    weights' product: only quantization itself changes the logits."""
    write_checkpoint(tmp_path, "llama")
    checkpoint = load_checkpoint(tmp_path)
    weights = weights_from_checkpoint(checkpoint, precision, block)
    quantized = LlmModel(checkpoint.config, weights)
    assert weights.layers[0].gate_up.kind == precision and weights.embed.kind == precision
    dense = weights_from_checkpoint(checkpoint, precision, block)
    for layer in dense.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(layer, name, make_matrix(getattr(layer, name).dense(), "fp32"))
    dense.embed = make_matrix(weights.embed.dense(), "fp32")
    dense.lm_head = make_matrix(weights.lm_head.dense(), "fp32")
    floating = LlmModel(checkpoint.config, dense)
    a, b = quantized.new_cache(), floating.new_cache()
    np.testing.assert_allclose(quantized.forward(PROMPT, a), floating.forward(PROMPT, b), atol=1e-4, rtol=0)
    for token in (7, 19, 200, 3):
        np.testing.assert_allclose(
            quantized.forward([token], a), floating.forward([token], b), atol=1e-4, rtol=0
        )
