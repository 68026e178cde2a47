"""Hypothesis: the Conv kernels the search may pick (Winograd F(2x2, 3x3), F(4x4, 3x3) and
F(2, 3) along the rows, im2col over exact phase windows and over a channels-last copy, the
1x1 with its bias as a GEMM column, depthwise in both layouts with a fused clip) and the
separable MaxPool, on random shapes and attributes, against the ONNX reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import kernels
from engine.ops import conv, pool, scratch
from engine.search import with_packed
from tests.engine.helpers import (
    assert_candidates_match,
    assert_same,
    run_engine,
    run_onnxruntime,
    run_reference,
    single_node_model,
)

SETTINGS = settings(max_examples=30, deadline=None)


def _scaled_atol(want: np.ndarray) -> float:
    """The accuracy bar of the issue: 1e-4 of the output's magnitude (at least 1e-4)."""
    return 1e-4 * max(1.0, float(np.max(np.abs(want), initial=0.0)))


def assert_own_result(got: np.ndarray, inputs: list) -> None:
    """A conv kernel's result: memory of its own (no input's, no scratch buffer's, which the
    next kernel overwrites), laid out NCHW or channels last (a transposed view, see conv._Result)."""
    buffers = list(getattr(scratch._local, "buffers", {}).values())
    assert not any(np.shares_memory(got, a) for a in [*inputs, *buffers] if a is not None)
    assert got.flags.writeable
    assert got.flags.c_contiguous or got.strides[1] == got.itemsize


@st.composite
def winograd_cases(draw, stride: int = 1):
    """A 3x3 conv (random channels, sizes, pads, optional bias) at the given stride."""
    n = draw(st.integers(1, 2))
    c, m = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    height, width = draw(st.integers(1, 19)), draw(st.integers(1, 19))
    pads = draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))
    if height + pads[0] + pads[2] < 3 or width + pads[1] + pads[3] < 3:
        pads = [1, 1, 1, 1]  # the 3x3 window must fit
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    attrs = {"pads": pads} if stride == 1 else {"pads": pads, "strides": [stride, stride]}
    return [x, w] + ([b] if b is not None else []), attrs


@SETTINGS
@given(winograd_cases(), st.booleans())
def test_winograd4_matches_the_reference(case, prepacked):
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    args = list(inputs)
    if prepacked:
        args[1] = conv.pack_winograd4(inputs[1])
        assert args[1].shape == (36, inputs[1].shape[1], inputs[1].shape[0])
    got = conv.conv_winograd4(args, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=_scaled_atol(want))


@SETTINGS
@given(st.integers(2, 3), st.integers(0, 2**16))
def test_winograd4_falls_back_to_im2col_for_strided_convs(stride, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 11, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride]}
    assert not conv.winograd4_ok(x.shape, w.shape, attrs)
    assert conv.conv_winograd4.pack([x, w], attrs) == {}
    model, feeds = single_node_model("Conv", [x, w], attrs)
    np.testing.assert_allclose(
        conv.conv_winograd4([x, w], attrs)[0], run_reference(model, feeds)[0], rtol=1e-4, atol=1e-4
    )


def test_winograd4_is_a_candidate_only_with_enough_tiles():
    """Fewer tiles: F(2, 3) along the rows instead of both 2-D forms."""
    attrs = {"pads": [1, 1, 1, 1]}
    big, small = (1, 8, 16, 16), (1, 8, 7, 7)  # 16 and 4 tiles of 4x4
    for kernel in (conv.conv_winograd, conv.conv_winograd4):
        assert kernel in conv.conv_candidates(attrs, [big, (8, 8, 3, 3)])
        assert kernel not in conv.conv_candidates(attrs, [small, (8, 8, 3, 3)])


@st.composite
def strided_conv_cases(draw):
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    c, m = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    extent_h, extent_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    height, width = extent_h + draw(st.integers(0, 9)), extent_w + draw(st.integers(0, 9))
    attrs = {"strides": [sh, sw], "dilations": [dh, dw], "group": group}
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad == "NOTSET":
        attrs["pads"] = draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
    else:
        attrs["auto_pad"] = auto_pad
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((draw(st.integers(1, 2)), c, height, width)).astype(np.float32)
    w = rng.standard_normal((m, c // group, kh, kw)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    return [x, w] + ([b] if b is not None else []), attrs


@SETTINGS
@given(strided_conv_cases())
def test_every_candidate_of_a_strided_conv_agrees_with_the_reference(case):
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    shapes = [a.shape for a in inputs]
    candidates = conv.conv_candidates(attrs, shapes)
    strided = any(s > 1 for s in attrs["strides"])
    general = candidates[0] is conv.conv_im2col
    assert (conv.conv_im2col_phased in candidates) == (strided and general and attrs["group"] == 1)
    assert_candidates_match(candidates, inputs, attrs, want, _scaled_atol(want))


@st.composite
def max_pool_cases(draw):
    nd = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    strides = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    dilations = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    # padding smaller than the kernel, as the spec requires: no window lies in the padding only
    pads = [draw(st.integers(0, k - 1)) for k in kernel] + [draw(st.integers(0, k - 1)) for k in kernel]
    spatial = [e + draw(st.integers(0, 5)) for e in extents]
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads}
    if draw(st.booleans()):
        attrs["ceil_mode"] = 1
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial)).astype(np.float32)
    return x, attrs


@SETTINGS
@given(max_pool_cases())
def test_separable_max_pool_matches_the_reference(case):
    x, attrs = case
    model, feeds = single_node_model("MaxPool", [x], attrs, opset=19)
    # onnxruntime is the oracle, as in test_ops_properties.test_pools: the reference
    # evaluator's pooling is wrong for asymmetric pads and ceil_mode
    want = run_onnxruntime(model, feeds)
    assert_same(run_engine(model, feeds), want, rtol=0, atol=0)
    got = pool.max_pool([x], attrs)[0]
    assert_same([got], want, rtol=0, atol=0)
    assert got.flags.c_contiguous
    assert not np.shares_memory(got, x)


def test_max_pool_of_a_unit_window_is_a_fresh_copy():
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    y = pool.max_pool([x], {"kernel_shape": [1, 1]})[0]
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(y, x)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 6),
    m=st.integers(1, 12),
    spatial=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    stride=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_1x1_with_the_bias_as_a_gemm_column_matches_the_reference(n, c, m, spatial, stride, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, *spatial)).astype(np.float32)
    w = rng.standard_normal((m, c, *[1] * len(spatial))).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"strides": [stride] * len(spatial)}
    model, feeds = single_node_model("Conv", [x, w, b], attrs)
    want = run_reference(model, feeds)[0]
    got = conv.conv_1x1_bias_row([x, w, b], attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if len(spatial) == 2:  # the search only offers variants for 2-D convs
        assert conv.conv_1x1_bias_row in conv.conv_candidates(attrs, [x.shape, w.shape, b.shape])
        assert conv.conv_1x1_bias_row not in conv.conv_candidates(attrs, [x.shape, w.shape])


def test_1x1_with_the_bias_as_a_gemm_column_falls_back_without_a_bias():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    w = rng.standard_normal((6, 2, 1, 1)).astype(np.float32)
    attrs = {"group": 2}
    want = conv.conv_1x1([x, w], attrs)[0]
    np.testing.assert_array_equal(conv.conv_1x1_bias_row([x, w], attrs)[0], want)


ACTIVATIONS = {
    None: {},
    "Relu": {"activation": "Relu"},
    "Clip": {"activation": "Clip", "activation_attrs": {"min": -0.5, "max": 1.5}},
    "ClipLow": {"activation": "Clip", "activation_attrs": {"min": 0.25}},
    "LeakyRelu": {"activation": "LeakyRelu", "activation_attrs": {"alpha": 0.1}},
}


def with_activation(attrs: dict, activation: str | None) -> dict:
    """A FusedConv's attrs: the conv's, plus the named activation (see ACTIVATIONS)."""
    return {**attrs, **ACTIVATIONS[activation]}


def _activation(y: np.ndarray, attrs: dict) -> np.ndarray:
    name, extra = attrs.get("activation"), attrs.get("activation_attrs") or {}
    if name == "Relu":
        return np.maximum(y, 0)
    if name == "Clip":
        return np.clip(y, extra.get("min", -np.inf), extra.get("max", np.inf))
    if name == "LeakyRelu":
        return np.where(y >= 0, y, y * np.float32(extra["alpha"]))
    return y


@SETTINGS
@given(
    size=st.integers(16, 22),
    activation=st.sampled_from(["Relu", "Clip", "ClipLow", "LeakyRelu", None]),
    stride=st.integers(1, 2),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_conv_candidates_apply_the_activation_exactly_once(size, activation, stride, bias, seed):
    """Winograd and the strided im2col forms clip in their last pass (``fuses_clip``):
    the search's FusedConv wrapper must then skip the activation, and still apply the ones
    the kernel does not fuse."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 4, size, size)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32) if bias else None
    attrs = with_activation({"pads": [1, 1, 1, 1], "strides": [stride, stride]}, activation)
    inputs = [x, w] if b is None else [x, w, b]
    want = _activation(conv.conv_im2col(inputs, attrs)[0], attrs)
    candidates = kernels.NUMPY["FusedConv"](attrs, [a.shape for a in inputs])
    names = [kernel.__name__ for kernel in candidates]
    assert ("fused_conv_winograd4" if stride == 1 else "fused_conv_im2col_phased") in names
    assert_candidates_match(candidates, inputs, attrs, want, _scaled_atol(want))
    assert conv.fused_bounds(attrs) == {
        "Relu": (0, None),
        "Clip": (-0.5, 1.5),
        "ClipLow": (0.25, None),
    }.get(activation)


@SETTINGS
@given(
    channels=st.integers(1, 9),
    size=st.integers(3, 12),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 3),
    pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    activation=st.sampled_from(["Relu", "Clip", "ClipLow", "LeakyRelu", None]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_depthwise_candidates_apply_the_activation_exactly_once(
    channels, size, kernel, stride, pads, activation, bias, seed
):
    """Both depthwise forms clip their output (``fuses_clip``): the wrapper must not clip again
    (harmless for Relu / Clip) and must still apply a LeakyRelu."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, channels, size, size + 1)).astype(np.float32)
    w = rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32)
    inputs = [x, w] + ([rng.standard_normal(channels).astype(np.float32)] if bias else [])
    attrs = with_activation({"pads": pads, "strides": [stride, stride], "group": channels}, activation)
    model, feeds = single_node_model("Conv", inputs, {k: attrs[k] for k in ("pads", "strides", "group")})
    want = _activation(run_reference(model, feeds)[0], attrs)
    candidates = kernels.NUMPY["FusedConv"](attrs, [a.shape for a in inputs])
    if channels > 1 and kernel > 1:  # a 1x1 depthwise conv runs as a (grouped) 1x1 GEMM
        assert "fused_conv_depthwise_nhwc" in [c.__name__ for c in candidates]
    assert_candidates_match(candidates, inputs, attrs, want, 1e-4)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 4),
    m=st.integers(1, 6),
    kernel=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    extra=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    tiles=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    bias=st.booleans(),
    pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_patch_conv_matches_the_reference(n, c, m, kernel, extra, tiles, bias, pad, seed):
    """kernel == stride (a patch embedding), with image sizes that leave a remainder the windows
    never reach; padded convs must fall back (still correct)."""
    rng = np.random.default_rng(seed)
    spatial = [t * k + min(e, k - 1) for t, k, e in zip(tiles, kernel, extra, strict=True)]
    x = rng.standard_normal((n, c, *spatial)).astype(np.float32)
    w = rng.standard_normal((m, c, *kernel)).astype(np.float32)
    inputs = [x, w, rng.standard_normal(m).astype(np.float32)] if bias else [x, w]
    attrs = {"strides": list(kernel), **({"pads": [1, 0, 1, 0]} if pad else {})}
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    got = conv.conv_patches(inputs, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=_scaled_atol(want))
    offered = conv.conv_patches in conv.conv_candidates(attrs, [a.shape for a in inputs])
    assert offered == (conv.select_conv(attrs, [a.shape for a in inputs]) is conv.conv_im2col)


@SETTINGS
@given(winograd_cases(stride=2), st.booleans())
def test_polyphase_winograd_for_stride_2_matches_the_reference(case, prepacked):
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    args = list(inputs)
    if prepacked:
        args = with_packed(conv.conv_winograd_s2, inputs, attrs)
        assert args[1].shape == (25 * inputs[1].shape[1], inputs[1].shape[0])
    got = conv.conv_winograd_s2(args, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_own_result(got, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=_scaled_atol(want))


@SETTINGS
@given(
    st.sampled_from([([1, 1], [1, 1]), ([2, 1], [1, 1]), ([3, 3], [1, 1]), ([2, 2], [2, 2])]),
    st.integers(0, 2**16),
)
def test_polyphase_winograd_falls_back_unless_stride_2(geometry, seed):
    strides, dilations = geometry
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 12, 11)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": strides, "dilations": dilations}
    assert not conv.winograd_s2_ok(x.shape, w.shape, attrs)
    assert conv.conv_winograd_s2.pack([x, w], attrs) == {}
    assert conv.conv_winograd_s2 not in conv.conv_candidates(attrs, [x.shape, w.shape])
    model, feeds = single_node_model("Conv", [x, w], attrs)
    want = run_reference(model, feeds)[0]
    np.testing.assert_allclose(conv.conv_winograd_s2([x, w], attrs)[0], want, rtol=1e-4, atol=1e-4)


def test_polyphase_winograd_is_a_candidate_for_3x3_stride_2_only():
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    assert conv.conv_winograd_s2 in conv.conv_candidates(attrs, [(1, 8, 28, 28), (16, 8, 3, 3)])
    assert conv.conv_winograd_s2 not in conv.conv_candidates(attrs, [(1, 8, 28, 28), (16, 8, 5, 5)])
    grouped = {**attrs, "group": 2}
    assert conv.conv_winograd_s2 not in conv.conv_candidates(grouped, [(1, 8, 28, 28), (16, 4, 3, 3)])


@SETTINGS
@given(strided_conv_cases(), st.sampled_from([None, "Relu", "Clip"]))
def test_im2col_over_exact_phase_windows_matches_the_reference(case, activation):
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    attrs = with_activation(attrs, activation)
    want = _activation(want, attrs)  # grouped convs fall back to im2col, and clip there
    got = conv.conv_im2col_phased(inputs, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert not any(np.shares_memory(got, a) for a in inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=_scaled_atol(want))
    shapes = [a.shape for a in inputs]
    strided = any(s > 1 for s in attrs["strides"])
    general = conv.select_conv(attrs, shapes) is conv.conv_im2col  # not 1x1 nor depthwise
    in_candidates = conv.conv_im2col_phased in conv.conv_candidates(attrs, shapes)
    assert in_candidates == (strided and general and attrs.get("group", 1) == 1)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 3),
    half_h=st.integers(1, 10),
    half_w=st.integers(1, 10),
    pads_end=st.sampled_from([(1, 1), (0, 0), (1, 0), (0, 1)]),
    seed=st.integers(0, 2**16),
)
def test_flat_3x3_stride_2_max_pool_matches_onnxruntime(n, c, half_h, half_w, pads_end, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, 2 * half_h, 2 * half_w)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, *pads_end]}
    assert pool._is_3x3_stride_2(x, pool._geometry(x, attrs))
    model, feeds = single_node_model("MaxPool", [x], attrs, opset=19)
    want = run_onnxruntime(model, feeds)
    got = pool.max_pool([x], attrs)[0]
    assert_same([got], want, rtol=0, atol=0)
    assert got.flags.c_contiguous and not np.shares_memory(got, x)
    # a transposed (non-contiguous) input of the same values pools the same
    strided = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(pool.max_pool([strided], attrs)[0], got)


def test_flat_3x3_stride_2_max_pool_is_not_used_for_odd_sizes_or_ceil_mode():
    x = np.zeros((1, 1, 8, 7), dtype=np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    assert not pool._is_3x3_stride_2(x, pool._geometry(x, attrs))
    even = np.zeros((1, 1, 8, 8), dtype=np.float32)
    assert not pool._is_3x3_stride_2(even, pool._geometry(even, {**attrs, "ceil_mode": 1}))
    assert pool._is_3x3_stride_2(even, pool._geometry(even, attrs))


def test_kernels_that_fuse_the_clip_still_clip_when_they_fall_back():
    """The search's FusedConv wrapper skips the activation for ``fuses_clip`` kernels, so one
    handed shapes it cannot run (a stale choice) must clip in its fallback too."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)  # group 2: none of them runs it
    clip = {"activation": "Clip", "activation_attrs": {"min": 0.0, "max": 0.5}}
    attrs = {"group": 2, "strides": [2, 2], **clip}
    want = np.clip(conv.conv_im2col([x, w], attrs)[0], 0.0, 0.5)
    kernels = (
        conv.conv_im2col_phased,
        conv.conv_im2col_hwc,
        conv.conv_winograd,
        conv.conv_winograd4,
        conv.conv_winograd_rows,
        conv.conv_winograd_s2,
        conv.conv_depthwise_flat,
        conv.conv_depthwise_nhwc,
    )
    for kernel in kernels:
        assert kernel.fuses_clip
        got = kernel([x, w], attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=kernel.__name__)


def test_strided_im2col_kernels_split_a_large_batch(monkeypatch):
    """Above the column budget the batch runs in slices (scratch buffers outlive the call);
    the result is the same."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 3, 11, 11)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    want = conv.conv_im2col([x, w, b], attrs)[0]
    # the kernels (engine.ops.conv.im2col) and the slicing (conv.common) each read the budget
    for module in (conv.im2col, conv.common):
        monkeypatch.setattr(module, "COLUMN_BUDGET_BYTES", 4096)  # two images per slice at most
    sliced = []
    original = conv._in_batches

    def counting(kernel, inputs, attrs, per_image):
        sliced.append(kernel)
        return original(kernel, inputs, attrs, per_image)

    monkeypatch.setattr(conv.im2col, "_in_batches", counting)
    for kernel in (conv.conv_im2col_phased, conv.conv_im2col_hwc):
        np.testing.assert_allclose(kernel([x, w, b], attrs)[0], want, rtol=1e-5, atol=1e-5)
        assert kernel in sliced


@SETTINGS
@given(strided_conv_cases(), st.booleans(), st.sampled_from([None, "Relu", "Clip"]))
def test_channels_last_im2col_matches_the_reference(case, prepacked, activation):
    """Any 2-D conv (grouped ones fall back), its weights packed tap-major or not."""
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    attrs = with_activation({**attrs, "kernel_shape": list(inputs[1].shape[2:])}, activation)
    want = _activation(want, attrs)
    args = with_packed(conv.conv_im2col_hwc, inputs, attrs) if prepacked else list(inputs)
    m, c, kh, kw = inputs[1].shape
    if prepacked and attrs["group"] == 1:
        assert args[1].shape == (m, kh * kw * c)
    got = conv.conv_im2col_hwc(args, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_own_result(got, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=_scaled_atol(want))


def test_channels_last_im2col_is_a_candidate_for_ungrouped_convs_with_enough_channels():
    attrs = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    wide, narrow = conv.HWC_MIN_CHANNELS, conv.HWC_MIN_CHANNELS - 1
    assert conv.conv_im2col_hwc in conv.conv_candidates(attrs, [(1, wide, 7, 7), (8, wide, 3, 3)])
    assert conv.conv_im2col_hwc not in conv.conv_candidates(attrs, [(1, narrow, 7, 7), (8, narrow, 3, 3)])
    grouped = {**attrs, "group": 2}
    assert conv.conv_im2col_hwc not in conv.conv_candidates(grouped, [(1, 2 * wide, 7, 7), (8, wide, 3, 3)])
    assert conv.conv_im2col_hwc.pack([np.zeros((1, 4, 5, 5)), np.zeros((2, 4, 3, 3))], {}) == {}


WINOGRAD_FORMS = {  # kernel, its weight packing, and the packed shape for M filters of C channels
    "F(2x2)": (conv.conv_winograd, conv.pack_winograd, lambda m, c: (16, c, m)),
    "F(2) along rows": (conv.conv_winograd_rows, conv.pack_winograd_rows, lambda m, c: (4, 3 * c, m)),
}


@pytest.mark.parametrize("form", sorted(WINOGRAD_FORMS))
@SETTINGS
@given(winograd_cases(), st.booleans(), st.sampled_from([None, "Relu", "Clip"]))
def test_channels_last_winograd_forms_match_the_reference(form, case, prepacked, activation):
    kernel, pack, packed_shape = WINOGRAD_FORMS[form]
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    attrs = with_activation(attrs, activation)
    want = _activation(want, attrs)
    args = list(inputs)
    if prepacked:
        args[1] = pack(inputs[1])
        assert args[1].shape == packed_shape(*inputs[1].shape[:2])
    got = kernel(args, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_own_result(got, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=_scaled_atol(want))


def test_winograd_along_rows_is_a_candidate_only_where_f4x4_is_not():
    attrs = {"pads": [1, 1, 1, 1]}
    small, big = (1, 8, 7, 7), (1, 8, 16, 16)
    assert conv.conv_winograd_rows in conv.conv_candidates(attrs, [small, (8, 8, 3, 3)])
    assert conv.conv_winograd_rows not in conv.conv_candidates(attrs, [big, (8, 8, 3, 3)])
    strided = {**attrs, "strides": [2, 2]}
    assert conv.conv_winograd_rows not in conv.conv_candidates(strided, [small, (8, 8, 3, 3)])
    assert conv.conv_winograd_rows.pack([np.zeros(big), np.zeros((8, 8, 3, 3))], attrs) == {}
