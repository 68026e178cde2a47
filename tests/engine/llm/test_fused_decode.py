"""Decode's fused JIT path (engine/llm/layer_jit.py) against the per-op path it replaces: the
same logits and the same cache contents, at every weight precision and both cache kinds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from converter.llm.convert import _int8_activations
from engine import jit
from engine.llm.checkpoint import Checkpoint
from engine.llm.config import parse_config
from engine.llm.model import LlmModel, weights_from_checkpoint
from tests.engine.llm.checkpoints import config_dict, random_tensors, reference_logits

PROMPT = [5, 17, 42, 3, 99, 7, 250, 12, 64]
STEPS = 6
needs_jit = pytest.mark.skipif(not jit.enabled(), reason="the fused path is the JIT tier's")


def _model(precision: str, model_type: str = "llama", **extra: object) -> tuple[LlmModel, dict, dict]:
    hf = config_dict(model_type, **extra)
    tensors = random_tensors(hf, seed=3)
    checkpoint = Checkpoint(directory=Path("."), config=parse_config(hf), tensors=tensors)
    weights = weights_from_checkpoint(checkpoint, precision.split("-")[0], 32)
    if precision in ("int4-dot", "int8-dot"):  # what convert_llm stores: int8 activations, dot layout
        _int8_activations(weights)
    if precision == "int4-q8":  # what it stored before the dot layout (row groups of 4 or 8)
        for layer in weights.layers:
            for matrix in (layer.qkv, layer.o, layer.gate_up, layer.down):
                matrix.arrays["scale"] = matrix.arrays["scale"].astype(np.float16)
                matrix.activations = "int8"
    return LlmModel(checkpoint.config, weights), hf, tensors


def _decode(model: LlmModel, kind: str, fused: bool) -> tuple[list[np.ndarray], object]:
    """Prefill, then STEPS greedy decode steps with the fused path on or off; (logits, cache)."""
    model.fused_decode = fused
    cache = model.new_cache(kind=kind)
    logits = [model.forward(PROMPT, cache)]
    for _ in range(STEPS):
        logits.append(model.forward([int(np.argmax(logits[-1]))], cache))
    return logits, cache


@needs_jit
@pytest.mark.parametrize("precision", ["fp32", "int8", "int8-dot", "int4", "int4-q8", "int4-dot"])
@pytest.mark.parametrize("kind", ["fp32", "int8"])
@pytest.mark.parametrize(("model_type", "extra"), [("llama", {}), ("qwen2", {})])
def test_fused_decode_gives_the_per_op_paths_logits_and_cache(
    precision: str, kind: str, model_type: str, extra: dict
) -> None:
    model, _, _ = _model(precision, model_type, **extra)
    buffers = model._decode_buffers()
    assert buffers is not None
    fused, fused_cache = _decode(model, kind, True)
    plain, plain_cache = _decode(model, kind, False)
    # the one-call layer kernel serves the converter's int4 and int8 (qwen2: with q/k/v biases)
    one_call = [layer is not None for layer in buffers.one_call]
    assert one_call == [precision in ("int4-q8", "int4-dot", "int8", "int8-dot")] * len(one_call)
    if precision in ("int4-dot", "int8-dot"):
        assert {m.group for layer in model.weights.layers for m in (layer.qkv, layer.down)} == {16}
    if precision == "int8-dot":  # q + 128 as uint8 (gemv.py), the head tied to the embedding or not
        held = {m.arrays["q"].dtype.str for m in (model.weights.lm_head, model.weights.layers[0].o)}
        assert held == {"|u1"}
    # an int8 cache: a key an ulp apart (the fused norm sums in float64) may round to the next
    # level, ~1/254 of its scale: the logits then move by ~1e-4 of their range
    scale = np.abs(plain[-1]).max() * (2e-5 if kind == "fp32" else 5e-4)
    for a, b in zip(fused, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=scale)
        assert int(np.argmax(a)) == int(np.argmax(b))
    length = fused_cache.length
    assert length == plain_cache.length == len(PROMPT) + STEPS
    held = np.s_[:, :, :, :length]
    if kind == "fp32":
        np.testing.assert_allclose(fused_cache.data[held], plain_cache.data[held], rtol=0, atol=1e-5)
    else:  # int8: the same levels (a rounding tie may land one step apart) and scales
        assert np.abs(fused_cache.data[held].astype(int) - plain_cache.data[held]).max() <= 1
        np.testing.assert_allclose(fused_cache.scales[held], plain_cache.scales[held], rtol=1e-5)
    np.testing.assert_array_equal(fused_cache.tokens, plain_cache.tokens)


@needs_jit
def test_fused_decode_matches_the_independent_reference() -> None:
    """fp32 weights and cache, attention and o biases: each fused step against a full recompute."""
    model, hf, tensors = _model("fp32", "llama", attention_bias=True)
    cache = model.new_cache()
    tokens = list(PROMPT)
    model.forward(tokens, cache)
    for _ in range(STEPS):
        tokens.append(int(np.argmax(reference_logits(hf, tensors, tokens)[-1])))
        step = model.forward(tokens[-1:], cache)
        np.testing.assert_allclose(step, reference_logits(hf, tensors, tokens)[-1], atol=1e-4, rtol=0)
    assert model._decode_buffers() is not None


def test_without_jit_decode_takes_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_JIT", "0")
    model, hf, tensors = _model("fp32")
    cache = model.new_cache()
    model.forward(PROMPT, cache)
    step = model.forward([9], cache)
    assert model._decode_buffers() is None
    np.testing.assert_allclose(step, reference_logits(hf, tensors, [*PROMPT, 9])[-1], atol=1e-4, rtol=0)


@needs_jit
def test_threads_sharing_a_model_decode_with_their_own_buffers() -> None:
    """Two threads decode the same model over their own caches at once: each gets what a
    decode alone gets (the fused path's scratch is per thread)."""
    model, _, _ = _model("int4-dot")
    alone = _decode(model, "fp32", True)[0]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: _decode(model, "fp32", True)[0], range(4)))
    for logits in results:
        for a, b in zip(logits, alone, strict=True):
            np.testing.assert_array_equal(a, b)


@needs_jit
def test_fused_decode_takes_matrices_of_different_row_groups_in_one_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gemv.choose_group gives K = 576's matrices 8 rows per group and K = 1536's 4 (SmolLM2's
    o/qkv/gate_up and down): the one-call layer reads each matrix's group from its shapes."""
    from engine.llm import gemv  # noqa: PLC0415

    monkeypatch.setattr(gemv, "LANES_WANTED", 12)  # K = 64 (2 blocks) -> 8, K = 96 (3) -> 4
    model, _, _ = _model("int4-q8")
    layer = model.weights.layers[0]
    assert (layer.qkv.group, layer.o.group, layer.gate_up.group) == (8, 8, 8)
    assert layer.down.group == 4 and layer.down.shape[1] > layer.o.shape[1]
    buffers = model._decode_buffers()
    assert buffers is not None and all(found is not None for found in buffers.one_call)
    fused, _ = _decode(model, "fp32", True)
    plain, _ = _decode(model, "fp32", False)
    scale = np.abs(plain[-1]).max() * 2e-5
    for a, b in zip(fused, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=scale)
