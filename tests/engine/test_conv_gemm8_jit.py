"""Hypothesis: the 8-lane (AVX2) 1x1 conv GEMM (engine/ops/conv/gemm8_jit.py) against the numpy
kernel and onnx's ReferenceEvaluator: shapes across the 6 x 16 and 12 x 8 tile edges, strides,
layouts, packed and unpacked weights, bias, residual (in place too) and Relu / Clip, one and two
threads.  Skipped as a whole without numba or with FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit, kernels  # noqa: E402
from engine.ops import fused  # noqa: E402
from engine.ops.conv import conv_1x1  # noqa: E402
from engine.planner import memory_order  # noqa: E402
from tests.engine.helpers import laid_out  # noqa: E402
from tests.engine.test_conv_jit_chain import (  # noqa: E402
    ACTIVATIONS,
    LAYOUTS,
    _fused_expected,
    _with_activation,
    pointwise_cases,
)

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

jit.module("engine.ops.conv.gemm_conv_jit")
from engine.ops.conv import gemm8_jit  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(pointwise_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS))
def test_1x1_gemm8_matches_numpy_and_the_reference(case, activation, layout, residual_layout):
    x, w, b, residual, attrs = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b] + ([residual] if residual is not None else [])
    want = _fused_expected(inputs, attrs, activation)
    numpy_result = fused.with_activation(conv_1x1)(inputs, attrs)[0]
    laid = [laid_out(x, layout), w, b]
    if residual is not None:
        laid.append(laid_out(residual, residual_layout))
    kernel = fused.with_activation(gemm8_jit.conv_1x1_gemm8)
    for weights in (w, gemm8_jit.pack_pointwise16(w)):
        for threads in (1, 2):
            with jit.thread_limit(threads):
                got = kernel([laid[0], weights, *laid[2:]], attrs)[0]
            assert got.shape == want.shape and got.dtype == np.float32
            assert memory_order(got) == (0, 2, 3, 1) or got.shape[1] == 1 or got[0, 0].size == 1
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-4)


def _items(x, packed, out, b, residual, bounds, threads):
    """out = clip(x @ W + b + residual) through the work-item loop, as the conv kernel calls it."""
    rows, depth = x.shape
    m = out.shape[1]
    vector = np.zeros(packed.shape[0] * gemm8_jit.NR, np.float32)
    vector[:m] = b
    res = np.zeros((1, 1), np.float32) if residual is None else residual
    lo, hi = (-np.inf, np.inf) if bounds is None else bounds
    block = gemm8_jit.block_rows16(rows, depth, threads > 1)
    items = -(-rows // block) * packed.shape[0]
    args = (x.reshape(-1), packed.reshape(-1), out.reshape(-1), vector, res.reshape(-1))
    flags = (residual is not None, bounds is not None, np.float32(lo), np.float32(hi))
    geometry = (rows, depth, m, res.shape[1], block, 0, items)
    with jit.thread_limit(threads):
        jit.run(gemm8_jit._items16, gemm8_jit._items16_parallel, *args, *flags, *geometry)


@pytest.mark.parametrize("m", [3, 8, 16, 24, 40, 48, 144])
@pytest.mark.parametrize("rows", [1, 5, 6, 11, 12, 13, 30, 97, 3137])
def test_tiles_around_their_edges_match_numpy(m, rows):
    """6 x 16 tiles, 12 x 8 ones for a last panel of 8 channels, a block's last rows as a tile
    overlapping the one before, and the ragged rest through scratch: bias, residual and clip,
    at every row count around the tile and block edges (3137 rows: two blocks at K = 37)."""
    rng = np.random.default_rng(m * 10000 + rows)
    x = rng.standard_normal((rows, 37)).astype(np.float32)
    w = rng.standard_normal((37, m)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    residual = rng.standard_normal((rows, m)).astype(np.float32)
    packed = gemm8_jit.pack_panels16(w)
    assert gemm8_jit.packed_shape16(packed) == (37, m)
    for bounds, extra in ((None, None), ((-0.5, 0.75), residual), ((-0.5, 0.75), None)):
        want = x.astype(np.float64) @ w + b + (0 if extra is None else extra)
        if bounds is not None:
            want = np.clip(want, *bounds)
        for threads in (1, 2):
            out = np.full((rows, m), np.nan, np.float32)
            _items(x, packed, out, b, extra, bounds, threads)
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(37))


@pytest.mark.parametrize("rows", [7, 49, 100])
def test_a_residual_it_overwrites_is_added_once(rows):
    """The overlapping last tile is not recomputed when the output is the residual itself."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 19)).astype(np.float32)
    w = rng.standard_normal((19, 40)).astype(np.float32)
    residual = rng.standard_normal((rows, 40)).astype(np.float32)
    b = np.zeros(40, np.float32)
    packed = gemm8_jit.pack_panels16(w)
    separate = np.full((rows, 40), np.nan, np.float32)
    _items(x, packed, separate, b, residual, None, 1)
    np.testing.assert_allclose(separate, x.astype(np.float64) @ w + residual, rtol=1e-5, atol=1e-4)
    _items(x, packed, residual, b, residual, None, 1)  # in place
    np.testing.assert_array_equal(residual, separate)


def test_clip_keeps_nan_and_inf():
    x = np.ones((1, 3, 7, 1), np.float32)
    x[0, 0, 0], x[0, 1, 1], x[0, 2, 2] = np.nan, np.inf, -np.inf
    w = np.ones((20, 3, 1, 1), np.float32)
    attrs = {"kernel_shape": [1, 1], "activation": "Clip", "activation_attrs": {"min": -1.0, "max": 1.0}}
    got = fused.with_activation(gemm8_jit.conv_1x1_gemm8)([x, w], attrs)[0]
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as the kernel makes it
        want = np.clip(fused.with_activation(conv_1x1)([x, w], {"kernel_shape": [1, 1]})[0], -1.0, 1.0)
    np.testing.assert_array_equal(got, want)


def test_a_candidate_of_every_plain_1x1_conv_only():
    names = lambda found: [k.__name__ for k in found]  # noqa: E731
    one = {"kernel_shape": [1, 1]}
    assert "conv_1x1_gemm8" in names(kernels.jit_candidates("Conv", one, [(1, 8, 9, 9), (16, 8, 1, 1)]))
    padded = {"kernel_shape": [1, 1], "pads": [1, 1, 1, 1]}
    assert "conv_1x1_gemm8" not in names(
        kernels.jit_candidates("Conv", padded, [(1, 8, 9, 9), (16, 8, 1, 1)])
    )
    three = {"kernel_shape": [3, 3]}
    assert "conv_1x1_gemm8" not in names(kernels.jit_candidates("Conv", three, [(1, 8, 9, 9), (16, 8, 3, 3)]))


def test_packed_weights_for_other_shapes_fall_back_to_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    w = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    packed = gemm8_jit.pack_pointwise16(w)
    attrs = {"kernel_shape": [1, 1], "pads": [1, 1, 1, 1]}  # padded: not the GEMM's
    got = gemm8_jit.conv_1x1_gemm8([x, packed], attrs)[0]
    np.testing.assert_allclose(got, conv_1x1([x, w], attrs)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_slot_products_match_numpy(threads):
    """Winograd's slot products: out[s] = x[s] @ W[s] for 16 slots, each with its own filters."""
    rng = np.random.default_rng(threads)
    x = rng.standard_normal((16, 301, 33)).astype(np.float32)
    w = rng.standard_normal((16, 33, 40)).astype(np.float32)
    packed = np.stack([gemm8_jit.pack_panels16(slot) for slot in w])
    out = np.full((16, 301, 40), np.nan, np.float32)
    with jit.thread_limit(threads):
        gemm8_jit.gemm_batched16(x, packed, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 40), st.sampled_from([gemm8_jit.MR, gemm8_jit.TALL]))
def test_blocks_are_as_few_as_fit_allows_and_even(rows, fit_tiles, tile):
    """balanced_block: no block past ``fit``, no more blocks than ``fit`` needs, every block but
    the last whole tiles, and the last within a tile of the others (not 96 + 96 + 4)."""
    from engine.ops.conv.gemm_jit import balanced_block  # noqa: PLC0415

    fit = fit_tiles * tile
    block = balanced_block(rows, fit, tile)
    sizes = [min(block, rows - start) for start in range(0, rows, block)]
    assert 0 < block <= fit and block % tile == 0
    assert len(sizes) == -(-rows // fit)
    assert len(sizes) == 1 or sizes[-1] > block - tile * len(sizes)
