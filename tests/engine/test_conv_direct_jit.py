"""Hypothesis: the implicit-GEMM conv kernels (engine/ops/conv/direct_jit.py, NCHW and channels
last) against the numpy im2col kernel and onnx's ReferenceEvaluator, over channels, output
channels (whole 32-channel panels and not), kernel sizes, strides, dilations, symmetric and
asymmetric pads, batch, input and residual layouts, bias, residual, Relu / Clip, edge values,
packed and unpacked weights, and the parallel variant.  Skipped without numba or FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit  # noqa: E402
from engine.ops import fused  # noqa: E402
from engine.ops.conv import conv_im2col  # noqa: E402
from tests.engine.helpers import fused_conv_reference, laid_out  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

direct = jit.module("engine.ops.conv.direct_jit")
SETTINGS = settings(max_examples=60, deadline=None)
EDGES = (0.0, -0.0, 1e30, -1e30, 1e-30, 65504.0)
KERNELS = {
    "nchw": direct.conv_direct_jit,
    "nchw8": direct.conv_direct_jit8,
    "hwc": direct.conv_direct_jit_hwc,
}
PACKS = {"nchw": direct.pack_nchw, "nchw8": direct.pack_nchw, "hwc": direct.pack_columns}


@st.composite
def cases(draw):
    n, c = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 5, 16, 20]))
    m = draw(st.sampled_from([1, 8, 16, 24, 32, 40, 64, 70]))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride, dilation = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    height = draw(st.integers(max(1, (kh - 1) * dilation + 1 - pads[0] - pads[2]), 12))
    width = draw(st.integers(max(1, (kw - 1) * dilation + 1 - pads[1] - pads[3]), 15))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 6))):
            x[tuple(int(rng.integers(0, s)) for s in x.shape)] = draw(st.sampled_from(EDGES))
    w = rng.standard_normal((m, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {
        "group": 1,
        "kernel_shape": [kh, kw],
        "pads": pads,
        "strides": [stride, stride],
        "dilations": [dilation, dilation],
    }
    return x, w, b, attrs, draw(st.booleans())


@SETTINGS
@given(
    cases(),
    st.sampled_from((None, "Relu", "Clip")),
    st.sampled_from(("nchw", "channels_last", "strided")),
    st.sampled_from(("nchw", "nchw8", "hwc")),
    st.booleans(),
)
def test_direct_matches_numpy_and_the_reference(case, activation, layout, form, prepacked):
    x, w, b, attrs, with_residual = case
    if activation == "Relu":
        attrs = {**attrs, "activation": "Relu"}
    elif activation == "Clip":
        attrs = {**attrs, "activation": "Clip", "activation_attrs": {"min": 0.0, "max": 6.0}}
    residual = None
    inputs = [x, w, b]
    if with_residual:
        shape = conv_im2col([x, w, b], attrs)[0].shape
        residual = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        inputs.append(laid_out(residual, layout))
    want = fused_conv_reference(x, w, b, residual, attrs, activation)
    numpy_result = fused.with_activation(conv_im2col)(inputs, attrs)[0]
    weights = PACKS[form](w) if prepacked else w
    got = fused.with_activation(KERNELS[form])([laid_out(x, layout), weights, *inputs[2:]], attrs)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    scale = max(1.0, float(np.abs(x).max())) * np.sqrt(w[0].size)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-5 * scale)


def test_packed_weights_for_other_shapes_fall_back_unpacked():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    attrs = {"group": 1, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    for form in KERNELS:
        packed = PACKS[form](w)
        x = rng.standard_normal((1, 3, 6, 6)).astype(np.float64)  # float64: not the kernel's type
        got = KERNELS[form]([x, packed], attrs)[0]
        np.testing.assert_allclose(got, conv_im2col([x, w], attrs)[0], rtol=1e-5, atol=1e-5)


def test_parallel_variant_matches_the_serial_one():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 13, 9)).astype(np.float32)
    w = rng.standard_normal((40, 16, 3, 3)).astype(np.float32)
    attrs = {"group": 1, "kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "strides": [2, 2]}
    for kernel in KERNELS.values():
        serial = kernel([x, w], attrs)[0]
        with jit.thread_limit(2):
            parallel = kernel([x, w], attrs)[0]
        np.testing.assert_array_equal(parallel, serial)
        np.testing.assert_allclose(serial, conv_im2col([x, w], attrs)[0], rtol=1e-4, atol=1e-4)


def test_direct_is_offered_for_ungrouped_kernels_larger_than_1x1():
    stem = {"group": 1, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    found = direct.CANDIDATES["Conv"](stem, [(1, 3, 16, 16), (32, 3, 3, 3)])
    assert found == [direct.conv_direct_jit, direct.conv_direct_jit8]
    assert direct.CANDIDATES["Conv"](stem, [(1, 64, 16, 16), (64, 64, 3, 3)]) == []  # im2col_gemm's
    assert direct.CANDIDATES["Conv"]({"group": 1}, [(1, 64, 16, 16), (64, 64, 1, 1)]) == []
    assert direct.CANDIDATES["Conv"]({**stem, "group": 2}, [(1, 64, 16, 16), (64, 32, 3, 3)]) == []


def test_a_session_brings_the_jit_tier_in_for_ungrouped_convs_wider_than_1x1():
    """ResNet-style models (no grouped conv) load the conv JIT modules for their 3x3 and 7x7
    convs; a model of 1x1 convs alone still does not."""
    from engine.jit_needs import jit_ops as _jit_ops  # noqa: PLC0415
    from engine.ops.registry import REGISTRY  # noqa: PLC0415
    from engine.program import Program, Step  # noqa: PLC0415

    def program(*attrs: dict) -> Program:
        steps = [
            Step(f"n{i}", "FusedConv", REGISTRY.get("Conv"), None, a, [], []) for i, a in enumerate(attrs)
        ]
        return Program(steps, {}, [], [], 17)

    assert _jit_ops(program({"group": 1, "kernel_shape": [3, 3]})) == {"FusedConv"}
    assert _jit_ops(program({"group": 1, "kernel_shape": [1, 1]})) == set()
