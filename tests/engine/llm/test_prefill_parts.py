"""Prefill on several threads (engine/llm/model.py's ``row_parts``): a block's rows run in parts
shared out over threads, layer by layer, and give one thread's logits and cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import batch_split, jit
from engine.llm import threads as llm_threads
from engine.llm.checkpoint import load_checkpoint
from engine.llm.lora import LoraAdapter, LowRank
from engine.llm.model import LlmModel, row_parts, weights_from_checkpoint
from tests.engine.llm.checkpoints import write_checkpoint

CONTEXT = 256
PROMPT = [int(t) for t in np.random.default_rng(7).integers(1, 300, 150)]


@given(st.integers(1, 600), st.integers(1, 8))
def test_row_parts_cover_the_block_once_in_token_tiles(m: int, threads: int) -> None:
    parts = row_parts(m, threads)
    assert parts[0].start == 0 and parts[-1].stop == m
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:], strict=False))
    assert all(p.stop > p.start for p in parts)
    assert all((p.stop - p.start) % 8 == 0 for p in parts[:-1])
    assert len(parts) <= 2 * threads
    if threads == 1 or m < 64:
        assert len(parts) == 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    directory = tmp_path_factory.mktemp("llama")
    write_checkpoint(directory, "llama", max_position_embeddings=CONTEXT)
    return load_checkpoint(directory)


def _prefill(
    model: LlmModel, threads: int, kind: str = "fp32", adapter: LoraAdapter | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Logits of every position over a cache that already holds a prefix, and the cache's bytes."""
    cache = model.new_cache(CONTEXT, kind)
    with llm_threads.running_on(threads):
        model.forward(PROMPT[:10], cache, adapter=adapter)  # parts start past a cached prefix
        logits = model.forward(PROMPT[10:], cache, all_logits=True, adapter=adapter)
    return logits, cache.data[:, :, :, : len(PROMPT)].copy()


def _counting_share_out(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = batch_split.share_out

    def share_out(run, items, threads):  # noqa: ANN001, ANN202
        calls.append(len(items))
        return real(run, items, threads)

    monkeypatch.setattr(batch_split, "share_out", share_out)
    return calls


@pytest.mark.parametrize(("precision", "kind"), [("fp32", "fp32"), ("int8", "fp32"), ("int4", "int8")])
def test_two_threads_prefill_in_parts_gives_one_threads_logits_and_cache(
    checkpoint, precision: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint, precision, 32))
    one_logits, one_cache = _prefill(model, 1, kind)
    calls = _counting_share_out(monkeypatch)
    two_logits, two_cache = _prefill(model, 2, kind)
    layers = checkpoint.config.num_layers
    # with the JIT tier: two phases per layer, 140 rows in parts; numpy-only: BLAS's threads
    assert calls == ([4] * 2 * layers if jit.enabled() else [])
    # numpy-only, OpenBLAS's own threads may round a product differently (the AVX2 EPYC's do),
    # and an int8 cache can turn that into one step of a key or value: one step, not more
    blas_int8 = not jit.enabled() and kind == "int8"
    atol, cache_atol = (1e-2, 1.0) if blas_int8 else (1e-5, 1e-5)
    np.testing.assert_allclose(two_logits, one_logits, rtol=0, atol=atol)
    np.testing.assert_allclose(
        two_cache.astype(np.float32), one_cache.astype(np.float32), rtol=0, atol=cache_atol
    )
    assert np.argmax(two_logits, axis=1).tolist() == np.argmax(one_logits, axis=1).tolist()


def test_an_adapter_applies_to_every_part(checkpoint) -> None:
    config = checkpoint.config
    model = LlmModel(config, weights_from_checkpoint(checkpoint, "int8", 32))
    rng = np.random.default_rng(3)
    hidden, inner = config.hidden_size, config.intermediate_size

    def low_rank(n: int, k: int) -> LowRank:
        return LowRank(
            rng.standard_normal((2, k)).astype(np.float32) * 0.1,
            rng.standard_normal((n, 2)).astype(np.float32) * 0.1,
        )

    layers = [
        {"gate_up": low_rank(2 * inner, hidden), "down": low_rank(hidden, inner)}
        for _ in range(config.num_layers)
    ]
    adapter = LoraAdapter(name="parts", rank=2, layers=layers)
    one, _ = _prefill(model, 1, adapter=adapter)
    two, _ = _prefill(model, 2, adapter=adapter)
    base, _ = _prefill(model, 2)
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-5)
    assert np.abs(two - base).max() > 1e-3  # the adapter changed every part's logits, not just some
    assert (np.abs(two - base).max(axis=1) > 1e-4).all()


def test_a_failing_part_fails_the_call_and_leaves_the_cache_as_it_was(
    checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint, "int8", 32))
    cache = model.new_cache(CONTEXT)
    model.forward(PROMPT[:10], cache)
    real = LlmModel._attention

    def attention(self, q, cache, index, start, m):  # noqa: ANN001, ANN202
        if index == 1 and start + m > 100:  # a part of one layer (numpy-only: the block), any thread
            raise RuntimeError("part failed")
        return real(self, q, cache, index, start, m)

    monkeypatch.setattr(LlmModel, "_attention", attention)
    with llm_threads.running_on(2), pytest.raises(RuntimeError, match="part failed"):
        model.forward(PROMPT[10:], cache)
    assert cache.length == 10  # the failed block was not recorded: the next request refills it
    monkeypatch.setattr(LlmModel, "_attention", real)
    with llm_threads.running_on(2):
        again = model.forward(PROMPT[10:], cache)
    np.testing.assert_allclose(again, model.forward(PROMPT, model.new_cache(CONTEXT)), rtol=0, atol=1e-5)
