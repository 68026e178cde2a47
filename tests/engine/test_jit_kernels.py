"""Hypothesis: every JIT kernel (numba) against its numpy twin and onnx's ReferenceEvaluator, over
shapes, attributes, layouts (NCHW, channels-last views, strided), dtypes (non-float32 falls back
to numpy) and edge values (inf, NaN, int8 extremes).  Skipped as a whole without numba; the
kernel layer's numpy-only behaviour is tested in test_kernel_layer.py, which always runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit, kernels  # noqa: E402
from engine.ops import fastmath, fused, quantized  # noqa: E402
from engine.ops.conv import depthwise  # noqa: E402
from tests.engine.helpers import (  # noqa: E402
    assert_same,
    laid_out,
    run_engine,
    run_int8_matmul_reference,
    run_reference,
    single_node_model,
)

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

depthwise_jit = jit.module("engine.ops.conv.depthwise_jit")
quantized_jit = jit.module("engine.ops.quantized_jit")
rows_jit = jit.module("engine.ops.rows_jit")
DEPTHWISE = [depthwise_jit.conv_depthwise_jit, depthwise_jit.conv_depthwise_jit_nhwc]
SETTINGS = settings(max_examples=40, deadline=None)
LAYOUTS = ("nchw", "channels_last", "strided")


@st.composite
def depthwise_cases(draw):
    """A depthwise 2-D conv: random channels, image, kernel, stride, dilation, pads, bias."""
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 12))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))
    height = draw(st.integers(max(1, (kh - 1) * dilations[0] + 1 - pads[0] - pads[2]), 20))
    width = draw(st.integers(max(1, (kw - 1) * dilations[1] + 1 - pads[1] - pads[3]), 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if draw(st.booleans()) else None
    attrs = {"group": c, "pads": pads, "strides": strides, "dilations": dilations}
    return [x, w] + ([b] if b is not None else []), attrs


@SETTINGS
@given(depthwise_cases(), st.sampled_from(LAYOUTS))
def test_depthwise_jit_matches_numpy_and_the_reference(case, layout):
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    (want,) = run_reference(model, feeds)
    numpy_result = depthwise.conv_depthwise(inputs, attrs)[0]
    laid = [laid_out(inputs[0], layout), *inputs[1:]]
    for kernel in DEPTHWISE:
        got = kernel(laid, attrs)[0]
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)
        np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)


@SETTINGS
@given(depthwise_cases(), st.sampled_from([None, "Relu", "Clip"]), st.booleans(), st.sampled_from(LAYOUTS))
def test_depthwise_jit_fuses_residual_and_clip_as_the_numpy_form(case, activation, residual, layout):
    """FusedConv: residual added, then Relu / Clip, in the kernel's own pass (``fuses_clip``)."""
    inputs, attrs = case
    if activation:
        attrs = {**attrs, "activation": activation}
        if activation == "Clip":
            attrs["activation_attrs"] = {"min": -0.5, "max": 0.75}
    if len(inputs) == 2:
        inputs = [*inputs, None]
    if residual:
        out_shape = depthwise.conv_depthwise(inputs[:3], {"group": attrs["group"], **_geometry(attrs)})[
            0
        ].shape
        extra = np.random.default_rng(1).standard_normal(out_shape).astype(np.float32)
        inputs = [*inputs, laid_out(extra, layout)]
    want = fused.with_activation(depthwise.conv_depthwise)(inputs, attrs)[0]
    for kernel in DEPTHWISE:
        got = fused.with_activation(kernel)(inputs, attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)


def _geometry(attrs: dict) -> dict:
    return {key: attrs[key] for key in ("pads", "strides", "dilations")}


@pytest.mark.parametrize("kernel", DEPTHWISE, ids=lambda k: k.__name__)
def test_depthwise_jit_keeps_inf_and_nan_where_numpy_does(kernel):
    x = np.random.default_rng(2).standard_normal((1, 3, 7, 7)).astype(np.float32)
    x[0, 0, 3, 3], x[0, 1, 0, 0], x[0, 2, 6, 2] = np.inf, np.nan, -np.inf
    w = np.abs(np.random.default_rng(3).standard_normal((3, 1, 3, 3))).astype(np.float32)
    attrs = {"group": 3, "pads": [1, 1, 1, 1], "activation": "Clip", "activation_attrs": {"min": -1.0}}
    want = fused.with_activation(depthwise.conv_depthwise)([x, w], attrs)[0]
    got = fused.with_activation(kernel)([x, w], attrs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("kernel", DEPTHWISE, ids=lambda k: k.__name__)
def test_depthwise_jit_falls_back_to_numpy_for_other_dtypes(kernel, dtype):
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((1, 4, 6, 6)).astype(dtype), rng.standard_normal((4, 1, 3, 3)).astype(dtype)
    attrs = {"group": 4, "pads": [1, 1, 1, 1]}
    want = depthwise.conv_depthwise([x, w], attrs)[0]
    got = kernel([x, w], attrs)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == np.float16 else 1e-12)


@st.composite
def int8_cases(draw):
    """One float32 row times int8 weights [K, N] (N crosses a 64-column block, and the parallel
    split), per-column scales, optional bias, the int8 extremes included."""
    k, n = draw(st.integers(1, 300)), draw(st.integers(1, 600))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.integers(-128, 128, (k, n)).astype(np.int8)
    q[0, 0], q[-1, -1] = -128, 127
    scale = (rng.random(n) * 0.02 + 1e-4).astype(np.float32)
    a = rng.standard_normal((1, 1, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if draw(st.booleans()) else None
    return a, q, scale, bias


@SETTINGS
@given(int8_cases(), st.sampled_from([None, "Relu", "Gelu"]))
def test_int8_gemv_jit_matches_numpy_and_the_reference(case, activation):
    a, q, scale, bias = case
    attrs = {"activation": activation} if activation else {}
    inputs = [a, q, scale, None, bias]
    want = run_int8_matmul_reference(q, scale, a, bias, activation)
    numpy_result = quantized.qmatmul(inputs, attrs)[0]
    got = quantized_jit.qmatmul_gemv_jit(inputs, attrs)[0]
    # a K-term float32 sum in another order: error grows like sqrt(K) ulps of the terms' size
    atol = 1e-5 * math.sqrt(a.shape[-1]) * float(np.max(np.abs(a))) * float(np.max(scale)) * 128
    assert got.shape == want.shape == numpy_result.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=atol)
    with jit.thread_limit(2):  # the parallel variant
        np.testing.assert_allclose(
            quantized_jit.qmatmul_gemv_jit(inputs, attrs)[0], got, rtol=1e-6, atol=atol
        )
    wide, quantized_jit.MAX_WIDTH = quantized_jit.MAX_WIDTH, quantized_jit.LANES
    try:  # many narrow blocks, the last one partial
        np.testing.assert_allclose(
            quantized_jit.qmatmul_gemv_jit(inputs, attrs)[0], got, rtol=1e-6, atol=atol
        )
    finally:
        quantized_jit.MAX_WIDTH = wide


def test_int8_gemv_block_width_fits_l1_and_splits_for_threads():
    assert quantized_jit.block_width(16384, 1) == quantized_jit.MAX_WIDTH
    assert quantized_jit.block_width(1536, 1) == 1536
    assert quantized_jit.block_width(1536, 2) == 768
    assert quantized_jit.block_width(100, 2) == 64  # whole cache lines: 2 blocks, the last partial
    assert quantized_jit.block_width(5, 1) == 64


def test_int8_gemv_jit_falls_back_for_rows_zero_points_and_blocks():
    rng = np.random.default_rng(5)
    q = rng.integers(-128, 128, (16, 8)).astype(np.int8)
    scale = np.full(8, 0.01, np.float32)
    many = rng.standard_normal((3, 16)).astype(np.float32)
    zero = np.ones(8, np.int8)
    for inputs in ([many, q, scale], [many[:1], q, scale, zero]):
        np.testing.assert_array_equal(
            quantized_jit.qmatmul_gemv_jit(inputs, {})[0], quantized.qmatmul(inputs, {})[0]
        )


EDGES = np.array([0.0, -0.0, 1e-30, -1e-30, 5.9999, 6.0, 6.0001, -6.0, -6.0001, 40.0, -40.0], np.float32)


@st.composite
def gelu_rows(draw):
    rows, width = draw(st.integers(1, 5)), draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((rows, width)) * draw(st.sampled_from([0.5, 3.0, 10.0]))).astype(np.float32)
    x.reshape(-1)[: min(x.size, EDGES.size)] = EDGES[: x.size]
    return x


@SETTINGS
@given(gelu_rows())
@example(np.array([[np.inf, -np.inf, np.nan, 0.0]], np.float32))
def test_gelu_jit_matches_numpy_and_the_reference(x):
    model, feeds = single_node_model("Gelu", [x], {}, opset=20)
    (want,) = run_reference(model, feeds)
    numpy_result = fastmath.gelu_table_into(x, np.empty_like(x))
    got = rows_jit.gelu_jit([x], {})[0]
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])  # inf, and NaN where erf's formula gives it
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[finite], numpy_result[finite], rtol=1e-6, atol=1e-6)


@SETTINGS
@given(gelu_rows(), st.integers(1, 40), st.booleans())
def test_fused_matmul_gelu_jit_matches_numpy(a, n, with_bias):
    rng = np.random.default_rng(a.size + n)
    w = (rng.standard_normal((a.shape[1], n)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    attrs = {"activation": "Gelu"}
    inputs = [a, w] + ([bias] if with_bias else [])
    want = fused.fused_matmul(inputs, attrs)[0]
    got = rows_jit.fused_matmul_gelu_jit(inputs, attrs)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    scale = np.maximum(1, np.abs(np.nan_to_num(want)))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=2e-6 * scale.max())


def test_a_depthwise_model_runs_its_searched_kernel_with_the_jit_tier(tmp_path):
    """Through a Session (the search measures numpy and JIT candidates and keeps one), results
    equal the reference whichever it kept; the JIT kernels are among the candidates."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 16, 28, 28)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    attrs = {"group": 16, "pads": [1, 1, 1, 1]}
    names = {k.__name__ for k in kernels.candidates("Conv", attrs, [x.shape, w.shape])}
    assert {"conv_depthwise_jit", "conv_depthwise_jit_nhwc"} <= names
    model, feeds = single_node_model("Conv", [x, w], attrs)
    assert_same(run_engine(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-5)
