"""Hypothesis: flash attention's register kernel for 8- and 16-wide heads
(engine/diffusion/attention_tile_jit.py, reached through attention_jit.flash_attention) against
onnx's ReferenceEvaluator on the unfused graph and the batched numpy FusedAttention: shapes
around the 16-row tile, broadcast heads, scores far from zero, NaN, serial against parallel."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine import jit as jit_tier
from tests.engine.helpers import run_reference
from tests.engine.test_transformer_kernels import _array, _attention_model

pytestmark = pytest.mark.skipif(not jit_tier.enabled(), reason="numba is not installed (or FERRY_JIT=0)")
SETTINGS = settings(max_examples=30, deadline=None)


@pytest.fixture(scope="module")
def kernels():
    from engine.ops import fused  # noqa: PLC0415

    tiles = jit_tier.module("engine.diffusion.attention_tile_jit")
    return jit_tier.module("engine.diffusion.attention_jit"), fused, tiles


@st.composite
def tile_cases(draw):
    """q [*lead, S, D], k [*lead, T, D], v [*lead, T, D] with D 8 or 16, S across tile edges."""
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    width = draw(st.sampled_from([8, 16]))
    queries = draw(st.sampled_from([1, 15, 16, 17, 33, 64]) | st.integers(1, 80))
    keys = draw(st.integers(1, 90))
    seed = draw(st.integers(0, 2**32 - 1))
    spread = draw(st.sampled_from([0.1, 2.0, 6.0]))
    q, k = _array(seed, (*lead, queries, width), spread), _array(seed + 1, (*lead, keys, width), spread)
    v = _array(seed + 2, (*lead, keys, width))
    scale = draw(st.sampled_from([1.0, 1 / math.sqrt(width)]))
    return q, k, v, scale


@SETTINGS
@given(tile_cases(), st.booleans())
@example(
    (_array(1, (2, 8, 1024, 8), 2.0), _array(2, (2, 8, 77, 8), 2.0), _array(3, (2, 8, 77, 8)), 8**-0.5), False
)
def test_tiles_match_the_reference_and_the_numpy_kernel(kernels, case, k_transposed):
    flash, fused, _ = kernels
    q, k, v, scale = case
    model, feeds = _attention_model(q, k, v, None, scale)
    want = run_reference(model, feeds)[0]
    key = np.ascontiguousarray(np.swapaxes(k, -1, -2)) if k_transposed else k
    attrs = {"scale": scale, "k_transposed": int(k_transposed)}
    got = flash.flash_attention([q, key, v], attrs)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    # absolute to the output's scale: an output that cancels to ~0.02 from terms of ~1 keeps their
    # float32 error (2.1e-5 seen with scores spread 6 over 90 keys), which rtol alone refused
    atol = 3e-5 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
    np.testing.assert_allclose(got, fused.fused_attention([q, key, v], attrs)[0], rtol=1e-4, atol=atol)


@SETTINGS
@given(tile_cases())
def test_parallel_tiles_give_the_serial_result_exactly(kernels, case):
    flash, _, _ = kernels
    q, k, v, scale = case
    serial = flash.flash_attention([q, k, v], {"scale": scale})[0]
    with jit_tier.thread_limit(2):
        parallel = flash.flash_attention([q, k, v], {"scale": scale})[0]
    np.testing.assert_array_equal(serial, parallel)


@SETTINGS
@given(tile_cases())
def test_tiles_with_q_prescaled_by_log2e(kernels, case):
    flash, _, _ = kernels
    q, k, v, scale = case
    model, feeds = _attention_model(q, k, v, None, scale)
    want = run_reference(model, feeds)[0]
    prescaled = (q.astype(np.float64) * scale * math.log2(math.e)).astype(np.float32)
    got = flash.flash_attention([prescaled, k, v], {"scale": 1.0, "q_log2e": 1})[0]
    # rounding q * scale * log2(e) to float32 moves each score by up to ~eps * sum |q k| scale
    moved = np.finfo(np.float32).eps * (np.abs(q) @ np.abs(np.swapaxes(k, -1, -2))).max() * scale
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 + 2 * moved * np.abs(v).max())


@settings(max_examples=15, deadline=None)
@given(tile_cases(), st.lists(st.sampled_from([0.0, -40.0, -300.0, 45.0, 300.0]), min_size=1, max_size=20))
def test_tiles_are_shift_invariant_per_query(kernels, case, shifts):
    """Scores hundreds above or below zero: the exact row max keeps 2^x in range.  The shift
    rides on one extra channel (q's offset times a key channel of ones), so the head is one
    wider: 8 + 8 -> 16 stays on the tile kernel."""
    flash, _, tiles = kernels
    q, k, v, scale = case
    if q.shape[-1] != 8:
        return
    model, feeds = _attention_model(q, k, v, None, scale)
    want = run_reference(model, feeds)[0]
    offsets = np.resize(np.array(shifts, np.float32), q.shape[-2]) / scale
    column = np.broadcast_to(offsets[:, None], (*q.shape[:-1], 1))
    shifted_q = np.concatenate([q, column, np.zeros((*q.shape[:-1], 7), np.float32)], axis=-1)
    ones = np.ones((*k.shape[:-1], 1), np.float32)
    shifted_k = np.concatenate([k, ones, np.zeros((*k.shape[:-1], 7), np.float32)], axis=-1)
    v16 = np.concatenate([v, np.zeros_like(v)], axis=-1)
    assert shifted_q.shape[-1] in tiles.WIDTHS
    got = flash.flash_attention([shifted_q, shifted_k, v16], {"scale": scale})[0]
    np.testing.assert_allclose(got[..., :8], want, rtol=1e-4, atol=1e-4)
    assert np.all(got[..., 8:] == 0)


def test_broadcast_heads_nan_and_infinite_queries(kernels):
    """One batch of keys for two of queries; a NaN query gives a NaN row and only that row;
    an infinite one too (inf - inf), as the numpy kernel gives."""
    flash, fused, _ = kernels
    q, k, v = _array(4, (2, 4, 40, 8), 3.0), _array(5, (1, 4, 50, 8), 3.0), _array(6, (1, 4, 50, 8))
    q[0, 1, 3, 2] = np.nan
    q[1, 2, 20, 0] = np.inf
    got = flash.flash_attention([q, k, v], {"scale": 0.35})[0]
    want = fused.fused_attention([q, k, v], {"scale": 0.35})[0]
    bad = np.zeros(got.shape[:-1], bool)
    bad[0, 1, 3] = bad[1, 2, 20] = True
    assert np.all(np.isnan(got[bad])) and np.all(np.isnan(want[bad]))
    np.testing.assert_allclose(got[~bad], want[~bad], rtol=1e-4, atol=1e-5)


def test_other_widths_keep_the_block_kernel(kernels):
    """Heads 5, 40 wide, or q and v of different widths, take attention_jit's 64-row blocks
    (the tile kernel is compiled for 8 and 16 only); the results still match numpy's."""
    flash, fused, _ = kernels
    for d, dv in ((5, 5), (40, 40), (8, 16)):
        q, k, v = _array(7, (1, 2, 70, d)), _array(8, (1, 2, 30, d)), _array(9, (1, 2, 30, dv))
        got = flash.flash_attention([q, k, v], {"scale": d**-0.5})[0]
        np.testing.assert_allclose(
            got, fused.fused_attention([q, k, v], {"scale": d**-0.5})[0], rtol=1e-4, atol=1e-5
        )
