"""Prefill's one-pass kernels against numpy: the causal softmax (attention_jit's kernel and its
numpy twin against a plain per-row reference: each query sees the keys up to its own position,
the later ones get weight 0) and SwiGLU by rows (layer_jit.swiglu_rows)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import jit
from engine.llm.attention import causal_softmax_numpy

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")


def _reference(scores: np.ndarray, m: int, start: int) -> np.ndarray:
    out = np.zeros(scores.shape, np.float64)
    for h in range(scores.shape[0]):
        for r in range(scores.shape[1]):
            seen = scores[h, r, : start + r % m + 1].astype(np.float64)
            e = np.exp(seen - seen.max())
            out[h, r, : seen.size] = e / e.sum()
    return out


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    kv, group = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    m, start = draw(st.integers(1, 40)), draw(st.integers(0, 50))
    seed = draw(st.integers(0, 2**16))
    spread = draw(st.sampled_from([1.0, 30.0, 300.0]))  # large scores: the max must be taken first
    scores = np.random.default_rng(seed).standard_normal((kv, group * m, start + m)) * spread
    return scores.astype(np.float32), m, start


@settings(max_examples=60, deadline=None)
@given(_blocks())
def test_numpy_twin_matches_the_per_row_reference(block: tuple[np.ndarray, int, int]) -> None:
    scores, m, start = block
    expected = _reference(scores, m, start)
    causal_softmax_numpy(scores, m, start)
    np.testing.assert_allclose(scores, expected, atol=2e-6)


@needs_jit
@settings(max_examples=60, deadline=None)
@given(_blocks())
def test_jit_kernel_matches_the_per_row_reference(block: tuple[np.ndarray, int, int]) -> None:
    scores, m, start = block
    expected = _reference(scores, m, start)
    jit.module("engine.llm.attention_jit").causal_softmax(scores, m, start)
    np.testing.assert_allclose(scores, expected, atol=2e-6)


@needs_jit
def test_jit_kernel_zeroes_the_keys_after_each_query() -> None:
    m, start = 4, 2
    scores = np.zeros((1, 2 * m, start + m), np.float32)  # equal scores: uniform over what is seen
    jit.module("engine.llm.attention_jit").causal_softmax(scores, m, start)
    for r in range(2 * m):
        seen = start + r % m + 1
        np.testing.assert_allclose(scores[0, r, :seen], 1.0 / seen, rtol=1e-6)
        assert np.all(scores[0, r, seen:] == 0.0)


@needs_jit
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 70), st.integers(0, 2**16), st.sampled_from([1.0, 20.0, 200.0]))
def test_swiglu_rows_matches_numpy(m: int, n: int, seed: int, spread: float) -> None:
    gate_up = (np.random.default_rng(seed).standard_normal((m, 2 * n)) * spread).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    jit.module("engine.llm.layer_jit").swiglu_rows(gate_up, out)
    gate, up = gate_up[:, :n].astype(np.float64), gate_up[:, n:].astype(np.float64)
    expected = gate / (1.0 + np.exp(-gate)) * up
    np.testing.assert_allclose(out, expected, rtol=2e-6, atol=1e-6 * spread * spread)
