"""Hypothesis: the register-tiled JIT GEMM (engine/ops/conv/gemm_jit.py) against numpy, and the
Conv kernels on it (gemm_conv_jit.py: 1x1, and channels-last im2col for any kernel size) against
the numpy kernels and onnx's ReferenceEvaluator: shapes across the 6 x 32 tile edges, strides,
pads, dilations, layouts, packed and unpacked weights, bias, residual and Relu / Clip, one and two
threads.
Skipped as a whole without numba or with FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit, kernels, team  # noqa: E402
from engine.ops import fused  # noqa: E402
from engine.ops.conv import conv_1x1, conv_im2col  # noqa: E402
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

gemm_jit = jit.module("engine.ops.conv.gemm_jit")
gemm_conv_jit = jit.module("engine.ops.conv.gemm_conv_jit")
from engine.ops.conv import gemm8_jit  # noqa: E402 - loaded with gemm_jit (its 8-lane twin)

winograd_jit = jit.module("engine.ops.conv.winograd_jit")
SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(
    st.integers(1, 80),
    st.integers(1, 50),
    st.integers(1, 80),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.integers(1, 2),
    st.integers(0, 2**32 - 1),
)
def test_gemm_matches_numpy(rows, depth, m, with_bias, with_residual, with_clip, threads, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    w = rng.standard_normal((depth, m)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if with_bias else None
    residual = rng.standard_normal((rows, m)).astype(np.float32) if with_residual else None
    bounds = (-0.5, 0.75) if with_clip else None
    want = x.astype(np.float64) @ w
    want = want + (0 if b is None else b) + (0 if residual is None else residual)
    if bounds is not None:
        want = np.clip(want, *bounds)
    packed = gemm_jit.pack_panels(w)
    assert gemm_jit.packed_shape(packed) == (depth, m)
    out = np.full((rows, m), np.nan, np.float32)
    with jit.thread_limit(threads):
        gemm_jit.gemm(x, packed, out, b, residual, bounds)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(depth))


@pytest.mark.parametrize("m", [8, 16, 24, 40, 48, 56, 88])
@pytest.mark.parametrize("rows", [11, 12, 13, 30, 97, 200])
def test_gemm_narrow_panels_take_tall_tiles_and_match_numpy(m, rows):
    """Panels of 8, 16 and 24 channels run 12-row tiles (then 6-row and scratch ones for the
    rest): with bias, residual and clip, at every row count around the tile edges."""
    rng = np.random.default_rng(m * 1000 + rows)
    x = rng.standard_normal((rows, 37)).astype(np.float32)
    w = rng.standard_normal((37, m)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    residual = rng.standard_normal((rows, m)).astype(np.float32)
    for bounds, extra in ((None, None), ((-0.5, 0.75), residual), ((-0.5, 0.75), None)):
        want = x.astype(np.float64) @ w + b + (0 if extra is None else extra)
        if bounds is not None:
            want = np.clip(want, *bounds)
        out = np.full((rows, m), np.nan, np.float32)
        gemm_jit.gemm(x, gemm_jit.pack_panels(w), out, b, extra, bounds)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(37))


@pytest.mark.parametrize("rows", [29, 34, 35, 37, 38, 39, 40, 41, 49, 196])
def test_gemm_covers_a_block_with_7_and_6_row_tiles_and_matches_numpy(rows):
    """A block of n rows (n >= 7 * (n % 6)) runs n % 6 tiles of 7 rows, then 6-row ones: every
    remainder, with bias, residual and clip, full panels and a ragged last one, and in place."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 23)).astype(np.float32)
    w = rng.standard_normal((23, 80)).astype(np.float32)
    b = rng.standard_normal(80).astype(np.float32)
    residual = rng.standard_normal((rows, 80)).astype(np.float32)
    packed = gemm_jit.pack_panels(w)
    for bounds, extra in ((None, None), ((-0.5, 0.75), residual)):
        want = x.astype(np.float64) @ w + b + (0 if extra is None else extra)
        if bounds is not None:
            want = np.clip(want, *bounds)
        out = np.full((rows, 80), np.nan, np.float32)
        gemm_jit.gemm(x, packed, out, b, extra, bounds)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(23))
    separate = np.full((rows, 80), np.nan, np.float32)
    gemm_jit.gemm(x, packed, separate, None, residual, None)
    gemm_jit.gemm(x, packed, residual, None, residual, None)  # in place: each row added once
    np.testing.assert_array_equal(residual, separate)


def test_gemm_prefetches_the_next_panels_weights_and_still_matches_numpy():
    """The full tiles prefetch the next work item's weights (a line an unrolled iteration, see
    _gemm_items): the compiled kernel holds prefetch instructions, and slot products over several
    slots, row blocks and panels (each item's cursor ending at the next item, the last item's
    at its own weights) give numpy's results."""
    from numba import njit  # a fresh, uncached compile: cached code cannot be inspected

    micro = gemm_jit._micro((gemm_jit.LANES, gemm_jit.LANES), prefetch=True)
    free = np.float32(0)

    @njit(cache=False)
    def tile(x, w, out, bias, depth, pf):  # noqa: ANN001, ANN202
        micro(x, 0, depth, w, 0, 32, depth, out, 0, 32, bias, 0, bias, 0, 0, 0, free, free, pf)

    rng = np.random.default_rng(7)
    depth = 40
    x6 = rng.standard_normal((6, depth)).astype(np.float32)
    w32 = rng.standard_normal((depth, 32)).astype(np.float32)
    bias = np.zeros(32, np.float32)
    out6 = np.empty((6, 32), np.float32)
    packed6 = gemm_jit.pack_panels(w32).reshape(-1)
    tile(x6.reshape(-1), packed6, out6.reshape(-1), bias, depth, depth * 32 // 2)
    np.testing.assert_allclose(out6, x6.astype(np.float64) @ w32, rtol=1e-5, atol=1e-4)
    assert "prefetcht0" in "\n".join(tile.inspect_asm().values())
    slots, rows, depth, m = 3, 250, 400, 96  # 2 blocks of rows (400 K: 163 rows a block), 3 panels
    x = rng.standard_normal((slots, rows, depth)).astype(np.float32)
    w = rng.standard_normal((slots, depth, m)).astype(np.float32)
    packed = np.stack([gemm_jit.pack_panels(w[s]) for s in range(slots)])
    out = np.full((slots, rows, m), np.nan, np.float32)
    gemm_jit.gemm_batched(x, packed, out)
    want = np.einsum("spk,skm->spm", x.astype(np.float64), w)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(depth))


@pytest.mark.parametrize("rows", [7, 49, 100])
def test_gemm_adds_a_residual_it_overwrites_once(rows):
    """A block's last rows run as a tile overlapping the one before (recomputed, stored again),
    except when the output is the residual itself: that would add the residual twice."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 19)).astype(np.float32)
    w = rng.standard_normal((19, 40)).astype(np.float32)
    residual = rng.standard_normal((rows, 40)).astype(np.float32)
    want = x.astype(np.float64) @ w + residual
    packed = gemm_jit.pack_panels(w)
    separate = np.full((rows, 40), np.nan, np.float32)
    gemm_jit.gemm(x, packed, separate, None, residual, None)
    np.testing.assert_allclose(separate, want, rtol=1e-5, atol=1e-4)
    gemm_jit.gemm(x, packed, residual, None, residual, None)  # in place
    np.testing.assert_array_equal(residual, separate)


def test_gemm_on_two_threads_matches_one_and_small_ones_stay_on_one():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((301, 100)).astype(np.float32)  # 2.4 M multiply-adds: parallel
    w = rng.standard_normal((100, 80)).astype(np.float32)
    residual = rng.standard_normal((301, 80)).astype(np.float32)
    assert x.shape[0] * x.shape[1] * w.shape[1] >= team.POOL_MIN_MACS
    packed = gemm_jit.pack_panels(w)
    serial, parallel = np.empty((301, 80), np.float32), np.empty((301, 80), np.float32)
    gemm_jit.gemm(x, packed, serial, None, residual, (-1.0, 1.0))
    with jit.thread_limit(2):
        gemm_jit.gemm(x, packed, parallel, None, residual, (-1.0, 1.0))
    np.testing.assert_array_equal(parallel, serial)
    np.testing.assert_allclose(serial, np.clip(x @ w + residual, -1, 1), rtol=1e-5, atol=1e-4)


def test_gemm_clip_keeps_nan_and_inf():
    x = np.ones((7, 3), np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    packed = gemm_jit.pack_panels(np.ones((3, 20), np.float32))
    out = np.empty((7, 20), np.float32)
    gemm_jit.gemm(x, packed, out, None, None, (-1.0, 1.0))
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as the kernel makes it
        want = np.clip(x @ np.ones((3, 20), np.float32), -1.0, 1.0)
    np.testing.assert_array_equal(out, want)


@SETTINGS
@given(pointwise_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS))
def test_1x1_gemm_matches_numpy_and_the_reference(case, activation, layout, residual_layout):
    x, w, b, residual, attrs = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b] + ([residual] if residual is not None else [])
    want = _fused_expected(inputs, attrs, activation)
    numpy_result = fused.with_activation(conv_1x1)(inputs, attrs)[0]
    laid = [laid_out(x, layout), w, b]
    if residual is not None:
        laid.append(laid_out(residual, residual_layout))
    kernel = fused.with_activation(gemm_conv_jit.conv_1x1_gemm)
    for weights in (w, gemm_conv_jit.pack_pointwise(w)):
        for threads in (1, 2):
            with jit.thread_limit(threads):
                got = kernel([laid[0], weights, *laid[2:]], attrs)[0]
            assert got.shape == want.shape and got.dtype == np.float32
            assert memory_order(got) == (0, 2, 3, 1) or got.shape[1] == 1 or got[0, 0].size == 1
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-4)


@st.composite
def conv_cases(draw):
    """A 2-D conv of one group: kernel 1-5 (3x3 most often), strides, dilations, pads."""
    n, c, m = draw(st.integers(1, 2)), draw(st.integers(1, 20)), draw(st.integers(1, 40))
    kh, kw = draw(st.sampled_from([(3, 3), (3, 3), (1, 3), (5, 5), (2, 2)]))
    strides = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    dilations = [draw(st.integers(1, 2)), 1]
    pads = draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))
    height = draw(st.integers(max(1, (kh - 1) * dilations[0] + 1 - pads[0] - pads[2]), 12))
    width = draw(st.integers(max(1, kw - pads[1] - pads[3]), 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((m, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    attrs = {"group": 1, "kernel_shape": [kh, kw], "pads": pads, "strides": strides, "dilations": dilations}
    return x, w, b, attrs, draw(st.booleans())


@SETTINGS
@given(conv_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS), st.sampled_from(["32", "16"]))
def test_im2col_gemm_matches_numpy_and_the_reference(case, activation, layout, panels):
    """conv_im2col_gemm on 6 x 32 tiles, conv_im2col_gemm8 on 6 x 16 ones (AVX2)."""
    x, w, b, attrs, with_residual = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b]
    if with_residual:
        shape = conv_im2col([x, w, b], attrs)[0].shape
        inputs.append(np.random.default_rng(5).standard_normal(shape).astype(np.float32))
    want = _fused_expected(inputs, attrs, activation)
    numpy_result = fused.with_activation(conv_im2col)(inputs, attrs)[0]
    inner, pack = {
        "32": (gemm_conv_jit.conv_im2col_gemm, gemm_conv_jit.pack_columns),
        "16": (gemm8_jit.conv_im2col_gemm8, gemm8_jit.pack_columns16),
    }[panels]
    kernel = fused.with_activation(inner)
    for weights in (w, pack(w)):
        for threads in (1, 2):
            with jit.thread_limit(threads):
                got = kernel([laid_out(x, layout), weights, *inputs[2:]], attrs)[0]
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "dtype"),
    [
        ((1, 4, 5, 5), (6, 4, 1, 1), {"pads": [1, 1, 1, 1]}, np.float32),  # a padded 1x1
        ((1, 4, 5, 5), (6, 2, 3, 3), {"group": 2}, np.float32),
        ((1, 4, 5, 5), (6, 4, 3, 3), {}, np.float64),
        ((1, 4, 5, 5), (6, 4, 1, 1), {}, np.float64),
    ],
)
def test_gemm_kernels_fall_back_to_numpy(x_shape, w_shape, attrs, dtype):
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    attrs = {"kernel_shape": list(w_shape[2:]), **attrs}
    want = conv_im2col([x, w], attrs)[0]
    for kernel in (
        gemm_conv_jit.conv_1x1_gemm,
        gemm_conv_jit.conv_im2col_gemm,
        gemm8_jit.conv_1x1_gemm8,
        gemm8_jit.conv_im2col_gemm8,
    ):
        got = kernel([x, w], attrs)[0]
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_packed_weights_for_other_shapes_are_unpacked_for_the_fallback():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float64)  # float64: the GEMM does not run it
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    got = gemm_conv_jit.conv_im2col_gemm([x, gemm_conv_jit.pack_columns(w)], attrs)[0]
    np.testing.assert_allclose(got, conv_im2col([x, w], attrs)[0], rtol=1e-5, atol=1e-5)
    got = gemm8_jit.conv_im2col_gemm8([x, gemm8_jit.pack_columns16(w)], attrs)[0]
    np.testing.assert_allclose(got, conv_im2col([x, w], attrs)[0], rtol=1e-5, atol=1e-5)
    one = rng.standard_normal((5, 4, 1, 1)).astype(np.float32)
    got = gemm_conv_jit.conv_1x1_gemm([x, gemm_conv_jit.pack_pointwise(one)], {"kernel_shape": [1, 1]})[0]
    np.testing.assert_allclose(got, conv_1x1([x, one], {})[0], rtol=1e-5, atol=1e-5)


def test_gemm_kernels_are_conv_candidates():
    one = {"group": 1, "kernel_shape": [1, 1]}
    three = {"group": 1, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    names = lambda found: [k.__name__ for k in found]  # noqa: E731
    assert "conv_1x1_gemm" in names(kernels.jit_candidates("Conv", one, [(1, 8, 9, 9), (16, 8, 1, 1)]))
    assert "conv_im2col_gemm" in names(kernels.jit_candidates("Conv", three, [(1, 8, 9, 9), (16, 8, 3, 3)]))
    assert "conv_im2col_gemm8" in names(kernels.jit_candidates("Conv", three, [(1, 8, 9, 9), (16, 8, 3, 3)]))
    depthwise = {"group": 8, "kernel_shape": [3, 3]}
    assert "conv_im2col_gemm" not in names(
        kernels.jit_candidates("Conv", depthwise, [(1, 8, 9, 9), (8, 1, 3, 3)])
    )


@st.composite
def winograd_cases(draw):
    """A 3x3 stride-1 conv: random channels across the tile edges, sizes, pads, optional bias."""
    n, c, m = draw(st.integers(1, 2)), draw(st.integers(1, 20)), draw(st.integers(1, 40))
    height, width = draw(st.integers(1, 19)), draw(st.integers(1, 19))
    pads = draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))
    if height + pads[0] + pads[2] < 3 or width + pads[1] + pads[3] < 3:
        pads = [1, 1, 1, 1]  # the 3x3 window must fit
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    return x, w, b, {"pads": pads, "kernel_shape": [3, 3]}, draw(st.booleans())


@SETTINGS
@given(winograd_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS), st.integers(1, 2))
def test_winograd_on_the_gemm_matches_numpy_and_the_reference(case, activation, layout, threads):
    x, w, b, attrs, with_residual = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b]
    if with_residual:
        shape = conv_im2col([x, w, b], attrs)[0].shape
        inputs.append(np.random.default_rng(8).standard_normal(shape).astype(np.float32))
    want = _fused_expected(inputs, attrs, activation)
    numpy_result = fused.with_activation(conv_im2col)(inputs, attrs)[0]
    shapes = [x.shape, w.shape, None if b is None else b.shape]
    found = winograd_jit.CANDIDATES["Conv"](attrs, shapes)
    assert winograd_jit.conv_winograd_gemm in found and winograd_jit.conv_winograd_gemm8 in found
    for inner in found:
        kernel = fused.with_activation(inner)
        for weights in (w, inner.pack([x, w], attrs)[1]):
            with jit.thread_limit(threads):
                got = kernel([laid_out(x, layout), weights, *inputs[2:]], attrs)[0]
            assert got.shape == want.shape and got.dtype == np.float32
            # Winograd's transforms round at the size of the sum of |x|·|w| over a window, which
            # edge values (all ±0.5, 0.75) make far larger than the output: F(4x4) loses ~1e-5 of it
            terms = float(np.abs(x).max()) * float(np.abs(w).reshape(w.shape[0], -1).sum(axis=1).max())
            atol = max(1e-4 * max(1.0, float(np.abs(want).max())), 2e-5 * terms)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=inner.__name__)
            np.testing.assert_allclose(got, numpy_result, rtol=1e-4, atol=atol, err_msg=inner.__name__)


def test_winograd_on_the_gemm_falls_back_off_its_shapes():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2], "kernel_shape": [3, 3]}
    assert winograd_jit.CANDIDATES["Conv"](attrs, [x.shape, w.shape]) == []
    got = winograd_jit.conv_winograd_gemm([x, w], attrs)[0]
    np.testing.assert_allclose(got, conv_im2col([x, w], attrs)[0], rtol=1e-5, atol=1e-5)


def test_1x1_gemm_on_two_threads_matches_one():
    """Past team.POOL_MIN_MACS the 1x1 conv runs its items on the pool, blocks cut for threads."""
    rng = np.random.default_rng(7)
    x = laid_out(rng.standard_normal((1, 64, 40, 40)).astype(np.float32), "channels_last")
    w = rng.standard_normal((96, 64, 1, 1)).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    residual = laid_out(rng.standard_normal((1, 96, 40, 40)).astype(np.float32), "channels_last")
    attrs = _with_activation({"group": 1, "kernel_shape": [1, 1]}, "Clip")
    kernel = fused.with_activation(gemm_conv_jit.conv_1x1_gemm)
    serial = kernel([x, gemm_conv_jit.pack_pointwise(w), b, residual], attrs)[0]
    with jit.thread_limit(2):
        parallel = kernel([x, gemm_conv_jit.pack_pointwise(w), b, residual], attrs)[0]
    np.testing.assert_array_equal(parallel, serial)
    want = fused.with_activation(conv_1x1)(
        [np.ascontiguousarray(x), w, b, np.ascontiguousarray(residual)], attrs
    )[0]
    np.testing.assert_allclose(serial, want, rtol=1e-5, atol=1e-4)


@SETTINGS
@given(
    st.integers(1, 4),
    st.integers(1, 70),
    st.integers(1, 80),
    st.sampled_from(["c", "transposed", "broadcast", "strided"]),
    st.integers(0, 2**32 - 1),
)
def test_packing_a_view_in_one_pass_is_pack_panels(slots, depth, m, view, seed):
    """pack_slots reads (S, K, M) views of any strides (attention's k^T and v per head) into the
    panels pack_panels makes from a contiguous copy (and, 16 wide, pack_panels16's)."""
    rng = np.random.default_rng(seed)
    if view == "transposed":  # k^T: (S, M, K) memory read as (S, K, M)
        src = np.swapaxes(rng.standard_normal((slots, m, depth)).astype(np.float32), -1, -2)
    elif view == "broadcast":  # one matrix shared by every slot (strides 0)
        src = np.broadcast_to(rng.standard_normal((1, depth, m)).astype(np.float32), (slots, depth, m))
    elif view == "strided":
        src = rng.standard_normal((slots, depth, 2 * m)).astype(np.float32)[..., ::2]
    else:
        src = rng.standard_normal((slots, depth, m)).astype(np.float32)
    np.testing.assert_array_equal(gemm_jit.pack_slots(src), gemm_jit.pack_panels(np.ascontiguousarray(src)))
    sixteen = np.stack([gemm8_jit.pack_panels16(np.ascontiguousarray(part)) for part in src])
    np.testing.assert_array_equal(gemm_jit.pack_slots(src, gemm8_jit.NR), sixteen)


@pytest.mark.parametrize(
    "module",
    ["gemm_jit", "gemm_conv_jit", "gemm8_jit", "direct_jit", "winograd_jit"],
)
def test_each_module_of_the_conv_gemm_imports_first(module):
    """These modules import each other (the 16-wide GEMM's convs fall back to the 32-wide ones,
    which dispatch 16-wide panels back): whichever a process imports first must load."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run(
        [sys.executable, "-c", f"import engine.ops.conv.{module}; from engine.ops.conv import gemm8_jit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
