"""Hypothesis: the register-tiled depthwise 3x3 kernel (engine/ops/conv/depthwise_vec_jit.py)
against the numpy depthwise kernel and onnx's ReferenceEvaluator, over channels (multiples of 16
and not: those fall back), image sizes down to smaller than the window, strides, symmetric and
asymmetric pads, input and residual layouts, bias, residual, Relu / Clip, edge values (huge,
tiny, zero, NaN), and its parallel variant.  Skipped without numba or with FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit  # noqa: E402
from engine.ops import fused  # noqa: E402
from engine.ops.conv import conv_depthwise  # noqa: E402
from tests.engine.helpers import fused_conv_reference, laid_out  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

vec = jit.module("engine.ops.conv.depthwise_vec_jit")
SETTINGS = settings(max_examples=60, deadline=None)
EDGES = (0.0, -0.0, 1e30, -1e30, 1e-30, 65504.0)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([16, 32, 48, 64, 8, 24]))  # 8 and 24: the fallback
    stride = draw(st.integers(1, 3))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    height = draw(st.integers(max(1, 3 - pads[0] - pads[2]), 13))
    width = draw(st.integers(max(1, 3 - pads[1] - pads[3]), 13))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    if draw(st.booleans()):  # edge values at a few places, borders included
        for _ in range(draw(st.integers(1, 6))):
            at = tuple(int(rng.integers(0, s)) for s in x.shape)
            x[at] = draw(st.sampled_from(EDGES))
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    attrs = {"group": c, "kernel_shape": [3, 3], "pads": pads, "strides": [stride, stride]}
    return x, w, b, attrs, draw(st.booleans())


@SETTINGS
@given(
    cases(),
    st.sampled_from((None, "Relu", "Clip")),
    st.sampled_from(("nchw", "channels_last", "strided")),
    st.sampled_from(("nchw", "channels_last")),
)
def test_vec_depthwise_matches_numpy_and_the_reference(case, activation, layout, residual_layout):
    x, w, b, attrs, with_residual = case
    if activation == "Relu":
        attrs = {**attrs, "activation": "Relu"}
    elif activation == "Clip":
        attrs = {**attrs, "activation": "Clip", "activation_attrs": {"min": 0.0, "max": 6.0}}
    residual = None
    inputs = [x, w, b]
    if with_residual:
        shape = conv_depthwise([x, w, b], attrs)[0].shape
        residual = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        inputs.append(laid_out(residual, residual_layout))
    want = fused_conv_reference(x, w, b, residual, attrs, activation)
    numpy_result = fused.with_activation(conv_depthwise)(inputs, attrs)[0]
    got = fused.with_activation(vec.conv_depthwise_jit_vec)([laid_out(x, layout), *inputs[1:]], attrs)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    # a huge input makes huge sums: the tolerance scales with the largest input
    scale = max(1.0, float(np.abs(x).max()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-5 * scale)


def test_nan_input_stays_nan_through_the_clip():
    c = 16
    x = np.ones((1, c, 5, 5), np.float32)
    x[0, 3, 0, 0] = np.nan  # a corner: read by the checked border path only
    x[0, 5, 2, 2] = np.nan  # the middle: read by the unchecked path
    w = np.ones((c, 1, 3, 3), np.float32)
    attrs = {"group": c, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Clip"}
    attrs["activation_attrs"] = {"min": 0.0, "max": 6.0}
    got = fused.with_activation(vec.conv_depthwise_jit_vec)([x, w, np.zeros(c, np.float32)], attrs)[0]
    want = fused.with_activation(conv_depthwise)([x, w, np.zeros(c, np.float32)], attrs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 3, :2, :2]).all() and np.isnan(got[0, 5, 1:4, 1:4]).all()
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_parallel_variant_matches_the_serial_one():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 67, 61)).astype(np.float32)  # past team.POOL_MIN_MACS at stride 1
    w = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    for stride in (1, 2):
        attrs = {"group": 32, "kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [stride, stride]}
        serial = vec.conv_depthwise_jit_vec([x, w, b], attrs)[0]
        with jit.thread_limit(2):
            parallel = vec.conv_depthwise_jit_vec([x, w, b], attrs)[0]
        np.testing.assert_array_equal(parallel, serial)
        np.testing.assert_allclose(serial, conv_depthwise([x, w, b], attrs)[0], rtol=1e-5, atol=1e-5)


def test_vec_kernel_is_offered_only_where_it_runs():
    dw = {"group": 32, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    assert vec.CANDIDATES["Conv"](dw, [(1, 32, 8, 8), (32, 1, 3, 3), (32,)]) == [vec.conv_depthwise_jit_vec]
    assert vec.CANDIDATES["Conv"]({**dw, "group": 24}, [(1, 24, 8, 8), (24, 1, 3, 3)]) == []
    assert vec.CANDIDATES["Conv"]({**dw, "dilations": [2, 2]}, [(1, 32, 8, 8), (32, 1, 3, 3)]) == []
    assert vec.CANDIDATES["Conv"]({**dw, "kernel_shape": [5, 5]}, [(1, 32, 8, 8), (32, 1, 5, 5)]) == []
    assert vec.CANDIDATES["Conv"]({"group": 1}, [(1, 32, 8, 8), (32, 32, 3, 3)]) == []
