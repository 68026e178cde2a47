"""Hypothesis: the channels-last JIT conv kernels (1x1 GEMM + JIT epilogue, small-channel im2col,
the depthwise 3x3 register path) against the numpy kernels and onnx's ReferenceEvaluator, over
shapes, strides, pads, layouts (NCHW, channels-last views, strided), packed and unpacked weights,
bias, residual and Relu / Clip; and the kernel search timing each node on the layout its
producer's choice leaves.  Skipped as a whole without numba or with FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit, kernels  # noqa: E402
from engine import search as search_module  # noqa: E402
from engine.ops import fused  # noqa: E402
from engine.ops.conv import conv_1x1, conv_depthwise, conv_im2col  # noqa: E402
from engine.planner import memory_order  # noqa: E402
from engine.search import KernelSearch  # noqa: E402
from tests.engine.helpers import assert_same, laid_out, run_engine, run_reference, single_node_model  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

pointwise_jit = jit.module("engine.ops.conv.pointwise_jit")
im2col_jit = jit.module("engine.ops.conv.im2col_jit")
depthwise_jit = jit.module("engine.ops.conv.depthwise_jit")
SETTINGS = settings(max_examples=40, deadline=None)
LAYOUTS = ("nchw", "channels_last", "strided")
ACTIVATIONS = (None, "Relu", "Clip")


def _with_activation(attrs: dict, activation: str | None) -> dict:
    if activation == "Relu":
        return {**attrs, "activation": "Relu"}
    if activation == "Clip":
        return {**attrs, "activation": "Clip", "activation_attrs": {"min": -0.5, "max": 0.75}}
    return attrs


def _fused_expected(inputs: list, attrs: dict, activation: str | None) -> np.ndarray:
    """onnx's reference Conv, plus the residual, then the activation: what a FusedConv means."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    plain = {k: v for k, v in attrs.items() if k not in ("activation", "activation_attrs")}
    model, feeds = single_node_model(
        "Conv", [np.ascontiguousarray(x), w] + ([b] if b is not None else []), plain
    )
    (want,) = run_reference(model, feeds)
    if len(inputs) > 3:
        want = want + inputs[3]
    if activation == "Relu":
        want = np.maximum(want, 0)
    elif activation == "Clip":
        want = np.clip(want, -0.5, 0.75)
    return want


@st.composite
def pointwise_cases(draw):
    n, c, m = draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 70))
    height, width = draw(st.integers(1, 17)), draw(st.integers(1, 17))
    stride = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    out = (n, m, -(-height // stride), -(-width // stride))
    residual = rng.standard_normal(out).astype(np.float32) if draw(st.booleans()) else None
    attrs = {"group": 1, "kernel_shape": [1, 1], "strides": [stride, stride]}
    return x, w, b, residual, attrs


@SETTINGS
@given(pointwise_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS))
def test_pointwise_jit_matches_numpy_and_the_reference(case, activation, layout, residual_layout):
    x, w, b, residual, attrs = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b] + ([residual] if residual is not None else [])
    want = _fused_expected(inputs, attrs, activation)
    numpy_result = fused.with_activation(conv_1x1)(inputs, attrs)[0]
    laid = [laid_out(x, layout), w, b]
    if residual is not None:
        laid.append(laid_out(residual, residual_layout))
    kernel = fused.with_activation(pointwise_jit.conv_1x1_jit)
    for weights in (w, pointwise_jit.pack_pointwise(w)):
        got = kernel([laid[0], weights, *laid[2:]], attrs)[0]
        assert got.shape == want.shape and got.dtype == np.float32
        assert memory_order(got) == (0, 2, 3, 1) or got.shape[1] == 1 or got[0, 0].size == 1
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-4)
    with jit.thread_limit(2):  # the parallel epilogue
        np.testing.assert_allclose(kernel(laid, attrs)[0], want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "dtype"),
    [
        ((1, 4, 5, 5), (6, 4, 1, 1), {"pads": [1, 1, 1, 1]}, np.float32),  # padded: not a plain GEMM
        ((1, 4, 5, 5), (6, 2, 1, 1), {"group": 2}, np.float32),
        ((1, 4, 5, 5), (6, 4, 1, 1), {}, np.float64),
    ],
)
def test_pointwise_jit_falls_back_to_numpy(x_shape, w_shape, attrs, dtype):
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    attrs = {**attrs, "kernel_shape": [1, 1], "activation": "Relu"}
    want = fused.with_activation(conv_1x1)([x, w], attrs)[0]
    got = fused.with_activation(pointwise_jit.conv_1x1_jit)([x, w], attrs)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@st.composite
def small_channel_cases(draw):
    n, c, m = draw(st.integers(1, 2)), draw(st.integers(1, 15)), draw(st.integers(1, 40))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
    height = draw(st.integers(max(1, (kh - 1) * dilations[0] + 1 - pads[0] - pads[2]), 20))
    width = draw(st.integers(max(1, (kw - 1) * dilations[1] + 1 - pads[1] - pads[3]), 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((m, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    attrs = {"group": 1, "kernel_shape": [kh, kw], "pads": pads, "strides": strides, "dilations": dilations}
    return x, w, b, attrs, draw(st.booleans())


@SETTINGS
@given(small_channel_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS))
def test_im2col_jit_matches_numpy_and_the_reference(case, activation, layout):
    x, w, b, attrs, with_residual = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b]
    if with_residual:
        shape = conv_im2col([x, w, b], attrs)[0].shape
        inputs.append(np.random.default_rng(8).standard_normal(shape).astype(np.float32))
    want = _fused_expected(inputs, attrs, activation)
    numpy_result = fused.with_activation(conv_im2col)(inputs, attrs)[0]
    kernel = fused.with_activation(im2col_jit.conv_im2col_jit)
    for weights in (w, im2col_jit.pack_columns(w)):
        got = kernel([laid_out(x, layout), weights, *inputs[2:]], attrs)[0]
        assert got.shape == want.shape and got.dtype == np.float32
        tolerance = 1e-5 * x.shape[1] * w.shape[2] * w.shape[3]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=tolerance)
        np.testing.assert_allclose(got, numpy_result, rtol=1e-4, atol=tolerance)


def test_im2col_jit_falls_back_for_many_channels_and_groups():
    rng = np.random.default_rng(9)
    for x_shape, w_shape, group in (((1, 16, 6, 6), (4, 16, 3, 3), 1), ((1, 4, 6, 6), (4, 2, 3, 3), 2)):
        x, w = (
            rng.standard_normal(x_shape).astype(np.float32),
            rng.standard_normal(w_shape).astype(np.float32),
        )
        attrs = {"group": group, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Relu"}
        want = fused.with_activation(conv_im2col)([x, w], attrs)[0]
        got = fused.with_activation(im2col_jit.conv_im2col_jit)([x, w], attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@st.composite
def depthwise3x3_cases(draw):
    """MobileNet's depthwise layers: 3x3, stride 1 or 2, pad 0-1, channels across a vector width."""
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 40))
    stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 1))
    height, width = draw(st.integers(3 - 2 * pad, 16)), draw(st.integers(3 - 2 * pad, 16))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    attrs = {"group": c, "kernel_shape": [3, 3], "pads": [pad] * 4, "strides": [stride, stride]}
    return x, w, b, attrs, draw(st.booleans())


@SETTINGS
@given(depthwise3x3_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from(LAYOUTS))
def test_depthwise_nhwc_register_path_matches_numpy_and_the_reference(case, activation, layout):
    x, w, b, attrs, with_residual = case
    attrs = _with_activation(attrs, activation)
    inputs = [x, w, b]
    if with_residual:
        shape = conv_depthwise([x, w, b], attrs)[0].shape
        inputs.append(laid_out(np.random.default_rng(10).standard_normal(shape).astype(np.float32), layout))
    want = _fused_expected([x, w, b, *(np.ascontiguousarray(r) for r in inputs[3:])], attrs, activation)
    numpy_result = fused.with_activation(conv_depthwise)(inputs, attrs)[0]
    got = fused.with_activation(depthwise_jit.conv_depthwise_jit_nhwc)(
        [laid_out(x, layout), *inputs[1:]], attrs
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-5)


def test_pointwise_and_small_channel_jit_kernels_are_conv_candidates():
    one = {"group": 1, "kernel_shape": [1, 1]}
    stem = {"group": 1, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    names = {k.__name__ for k in kernels.candidates("Conv", one, [(1, 8, 9, 9), (16, 8, 1, 1)])}
    assert "conv_1x1_jit" in names
    names = {k.__name__ for k in kernels.candidates("Conv", stem, [(1, 3, 16, 16), (8, 3, 3, 3)])}
    assert "conv_im2col_jit" in names
    names = {k.__name__ for k in kernels.candidates("Conv", stem, [(1, 32, 16, 16), (8, 32, 3, 3)])}
    assert "conv_im2col_jit" not in names


def test_the_search_records_the_layout_its_choice_leaves(tmp_path, monkeypatch):
    """A measured node's output order is kept, so the next node is timed on that layout."""
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((24, 8, 1, 1)).astype(np.float32)
    attrs = {"group": 1, "kernel_shape": [1, 1]}
    search = KernelSearch("0" * 64, threads=1)
    kernel, _ = search.choose("Conv", "pw", attrs, [x.shape, w.shape], [False, True], lambda: [x, w])
    assert search.output_orders["pw"] == memory_order(kernel([x, w], attrs)[0])


def test_a_mobilenet_style_chain_matches_the_reference_through_a_session():
    """Expand 1x1 + Clip, depthwise 3x3 + Clip, project 1x1, residual Add: whatever the search
    keeps per node (numpy or JIT, NCHW or channels last), the model's result is the reference's."""
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    rng = np.random.default_rng(12)
    c, hidden, size = 8, 48, 14
    weights = {
        "stem_w": rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.3,
        "expand_w": rng.standard_normal((hidden, c, 1, 1)).astype(np.float32) * 0.3,
        "expand_b": rng.standard_normal(hidden).astype(np.float32),
        "dw_w": rng.standard_normal((hidden, 1, 3, 3)).astype(np.float32) * 0.3,
        "dw_b": rng.standard_normal(hidden).astype(np.float32),
        "project_w": rng.standard_normal((c, hidden, 1, 1)).astype(np.float32) * 0.3,
        "project_b": rng.standard_normal(c).astype(np.float32),
        "low": np.array(0, np.float32),
        "high": np.array(6, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "stem_w"], ["s"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["s", "low", "high"], ["s6"]),
        helper.make_node("Conv", ["s6", "expand_w", "expand_b"], ["e"]),
        helper.make_node("Clip", ["e", "low", "high"], ["e6"]),
        helper.make_node("Conv", ["e6", "dw_w", "dw_b"], ["d"], group=hidden, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "low", "high"], ["d6"]),
        helper.make_node("Conv", ["d6", "project_w", "project_b"], ["p"]),
        helper.make_node("Add", ["p", "s6"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2 * size, 2 * size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    feeds = {"x": rng.standard_normal((1, 3, 2 * size, 2 * size)).astype(np.float32)}
    assert_same(run_engine(model, feeds), run_reference(model, feeds), rtol=1e-4, atol=1e-4)


def _kernel(name: str, channels_last: bool, shape: tuple[int, ...] = (1, 4, 3, 3)):
    def kernel(inputs, attrs):
        y = np.zeros(shape, np.float32)
        return [np.ascontiguousarray(y.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if channels_last else y]

    kernel.__name__ = name
    return kernel


@pytest.mark.parametrize("use_jit", [True, False])
def test_a_channels_last_kernel_wins_a_close_call_with_the_jit_tier(tmp_path, monkeypatch, use_jit):
    """Within CLOSE_CALL of the fastest, a channels-last result is kept (the next conv reads it
    for free); without the JIT tier the fastest is kept.  Timings are fixed, not measured."""
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path))
    nchw, last, slow = _kernel("nchw", False), _kernel("last", True), _kernel("slow", True)
    seconds = {nchw: 0.0020, last: 0.0021, slow: 0.0040}

    def fixed_rounds(runnable, attrs, best, clock=None, evict=None):
        for kernel, _ in runnable:
            best[kernel] = seconds[kernel]

    monkeypatch.setattr(search_module, "_time_rounds", fixed_rounds)
    monkeypatch.setitem(kernels.NUMPY, "Conv", lambda attrs, shapes: [nchw, last, slow])
    search = KernelSearch("1" * 64, threads=1, use_jit=use_jit)
    chosen, _ = search.choose("Conv", "n", {}, [(3,)], [False], lambda: [np.zeros(3, np.float32)])
    assert chosen is (last if use_jit else nchw)
    assert search.output_orders["n"] == ((0, 2, 3, 1) if use_jit else None)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_pointwise_jit_parallel_epilogue_on_a_large_output(activation):
    """Outputs above PARALLEL_MIN_ELEMENTS take the parallel epilogue when two threads are allowed."""
    rng = np.random.default_rng(13)
    x = laid_out(rng.standard_normal((1, 8, 40, 40)).astype(np.float32), "channels_last")
    w, b = rng.standard_normal((64, 8, 1, 1)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    residual = laid_out(rng.standard_normal((1, 64, 40, 40)).astype(np.float32), "channels_last")
    attrs = _with_activation({"group": 1, "kernel_shape": [1, 1]}, activation)
    assert pointwise_jit.PARALLEL_MIN_ELEMENTS <= 64 * 40 * 40
    want = fused.with_activation(conv_1x1)([x, w, b, residual], attrs)[0]
    with jit.thread_limit(2):
        got = fused.with_activation(pointwise_jit.conv_1x1_jit)([x, w, b, residual], attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_channels_last_kernel_wins_when_it_saves_the_next_conv_a_transposing_copy(tmp_path, monkeypatch):
    """Slower by more than CLOSE_CALL but by less than transposing its output would cost the
    next conv: the channels-last kernel is kept."""
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path))
    shape = (1, 32, 100, 100)  # 1.28 MB: at 1 ns a byte, a 1.28 ms copy
    nchw, last = _kernel("nchw", False, shape), _kernel("last", True, shape)
    seconds = {nchw: 0.0020, last: 0.0030}

    def fixed_rounds(runnable, attrs, best, clock=None, evict=None):
        for kernel, _ in runnable:
            best[kernel] = seconds[kernel]

    monkeypatch.setattr(search_module, "_time_rounds", fixed_rounds)
    monkeypatch.setattr(search_module, "transpose_seconds_per_byte", lambda: 1e-9)
    monkeypatch.setitem(kernels.NUMPY, "Conv", lambda attrs, shapes: [nchw, last])
    search = KernelSearch("2" * 64, threads=1)
    chosen, _ = search.choose("Conv", "n", {}, [(3,)], [False], lambda: [np.zeros(3, np.float32)])
    assert chosen is last
    seconds[last] = 0.0040  # now slower than the fastest plus the copy
    search = KernelSearch("3" * 64, threads=1)
    chosen, _ = search.choose("Conv", "n", {}, [(3,)], [False], lambda: [np.zeros(3, np.float32)])
    assert chosen is nchw


def test_the_transposing_copy_is_priced_once_per_process():
    rate = search_module.transpose_seconds_per_byte()
    assert 0 < rate < 1e-6 and search_module.transpose_seconds_per_byte() == rate
