"""ConvTranspose: random shapes and attributes against onnx's ReferenceEvaluator, onnxruntime where
the reference is wrong, and the bad inputs the kernel must refuse with a clear message."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import NodeExecutionError, Session, UnsupportedOperatorError
from engine.ops.conv_transpose import conv_transpose
from tests.engine.helpers import (
    assert_same,
    check_op,
    run_engine,
    run_onnxruntime,
    run_reference,
    single_node_model,
    write_model_package,
)

SETTINGS = settings(max_examples=25, deadline=None)
TOL = {"rtol": 1e-4, "atol": 1e-4}


def _array(draw, shape, scale: float = 1.0) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype=np.float32)


def _random(shape: tuple[int, ...], seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@st.composite
def conv_transpose_cases(draw):
    """(inputs, attrs, reference_ok): reference_ok is False where onnx's ReferenceEvaluator is
    known wrong and onnxruntime is the oracle: group > 1 (it slices W along the wrong axis and
    adds bias channel 0..M/g-1 to every group), an explicit output_shape (it ignores it without
    pads, keeps the pads with them), and SAME where the full output is shorter than
    input * stride (it zero-pads, onnxruntime keeps the full output; see conv_transpose.py)."""
    nd = draw(st.sampled_from([1, 2, 1, 2, 3]))
    kind = draw(st.sampled_from(["plain", "plain", "grouped", "depthwise"]))
    group = 1 if kind == "plain" else draw(st.integers(2, 3))
    c_per_group = 1 if kind == "depthwise" else draw(st.integers(1, 3))
    m_per_group = draw(st.integers(1, 2)) if kind == "depthwise" else draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3 if nd < 3 else 2), min_size=nd, max_size=nd))
    strides = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    dilations = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    spatial = draw(st.lists(st.integers(1, 5 if nd < 3 else 3), min_size=nd, max_size=nd))
    # both oracles refuse stride <= output_padding < dilation (the spec allows it: tested below)
    extra = [draw(st.integers(0, s - 1)) for s in strides]
    full = [
        s * (n - 1) + (k - 1) * d + 1 + e
        for n, k, s, d, e in zip(spatial, kernel, strides, dilations, extra, strict=True)
    ]
    mode = draw(st.sampled_from(["pads", "pads", "SAME_UPPER", "SAME_LOWER", "VALID", "output_shape"]))
    attrs: dict = {"strides": strides, "dilations": dilations, "group": group}
    if any(extra) or draw(st.booleans()):
        attrs["output_padding"] = extra
    reference_ok = group == 1
    if mode == "pads":
        begin = [draw(st.integers(0, min(2, f - 1))) for f in full]
        end = [draw(st.integers(0, min(2, f - b - 1))) for f, b in zip(full, begin, strict=True)]
        attrs["pads"] = begin + end
    elif mode == "output_shape":
        # from a crop of a few cells to onnxruntime's largest (the end zero-extended by stride - 1)
        attrs["output_shape"] = [
            draw(st.integers(max(1, f - 3), f - e + s - 1))
            for f, e, s in zip(full, extra, strides, strict=True)
        ]
        auto_pad = draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER"]))
        if auto_pad != "NOTSET":
            attrs["auto_pad"] = auto_pad
        if auto_pad == "NOTSET" and draw(st.booleans()):
            attrs["pads"] = [1] * (2 * nd)  # ignored when output_shape is given
        reference_ok = False
    else:
        attrs["auto_pad"] = mode
        if mode != "VALID" and any(f < n * s for f, n, s in zip(full, spatial, strides, strict=True)):
            reference_ok = False
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    n = draw(st.integers(1, 2))
    x = _array(draw, (n, group * c_per_group, *spatial))
    w = _array(draw, (group * c_per_group, m_per_group, *kernel))
    b = _array(draw, (group * m_per_group,)) if draw(st.booleans()) else None
    return [x, w] + ([b] if b is not None else []), attrs, reference_ok


@SETTINGS
@given(conv_transpose_cases())
def test_conv_transpose_matches_reference(case):
    inputs, attrs, reference_ok = case
    if reference_ok:
        check_op("ConvTranspose", inputs, attrs, **TOL)
        return
    model, feeds = single_node_model("ConvTranspose", inputs, attrs)
    assert_same(run_engine(model, feeds), run_onnxruntime(model, feeds), **TOL)


def test_float64_matches_reference():
    # onnxruntime has no float64 ConvTranspose: the reference evaluator only (group 1)
    x, w, b = (
        _random((2, 3, 5, 4), 1, np.float64),
        _random((3, 2, 3, 2), 2, np.float64),
        _random((2,), 3, np.float64),
    )
    attrs = {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 2], "dilations": [1, 2]}
    got = check_op("ConvTranspose", [x, w, b], attrs, rtol=1e-12, atol=1e-12)
    assert got[0].dtype == np.float64 and got[0].shape == (2, 2, 11, 13)


def test_float16_matches_reference_within_half_precision():
    # the engine accumulates in float32; the reference in float16, hence the loose tolerance
    x, w, b = (_random(s, i, np.float16) for i, s in enumerate([(1, 4, 6, 6), (4, 3, 4, 4), (3,)]))
    got = check_op(
        "ConvTranspose", [x, w, b], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, rtol=1e-2, atol=2e-2
    )
    want = conv_transpose(
        [x.astype(np.float32), w.astype(np.float32), b.astype(np.float32)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1]},
    )[0]
    assert got[0].dtype == np.float16
    np.testing.assert_array_equal(got[0], want.astype(np.float16))


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 8, 6, 7), (8, 4, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # the usual 2x upsampling
        ((2, 6, 5, 5), (6, 3, 2, 2), {"strides": [2, 2]}),  # non-overlapping 2x2 / 2
    ],
    ids=["k4s2p1", "k2s2"],
)
def test_upsampling_layers_match_onnxruntime(x_shape, w_shape, attrs):
    inputs = [_random(x_shape, 4), _random(w_shape, 5), _random((w_shape[1],), 6)]
    model, feeds = single_node_model("ConvTranspose", inputs, attrs)
    got = run_engine(model, feeds)
    assert got[0].shape == (x_shape[0], w_shape[1], 2 * x_shape[2], 2 * x_shape[3])
    assert_same(got, run_onnxruntime(model, feeds), **TOL)


def test_same_with_kernel_shorter_than_stride_follows_onnxruntime():
    # Full output 1 + 3 * 3 = 10 < input * stride = 12: onnxruntime keeps the 10 cells, the
    # reference zero-pads to 12 (the spec says input * stride).  We follow onnxruntime.
    x, w = _random((1, 2, 4), 7), _random((2, 3, 1), 8)
    model, feeds = single_node_model("ConvTranspose", [x, w], {"strides": [3], "auto_pad": "SAME_LOWER"})
    got = run_engine(model, feeds)
    assert got[0].shape == (1, 3, 10)
    assert_same(got, run_onnxruntime(model, feeds), **TOL)
    assert run_reference(model, feeds)[0].shape == (1, 3, 12)


@pytest.mark.parametrize(("auto_pad", "first"), [("NOTSET", 1), ("SAME_LOWER", 1), ("SAME_UPPER", 0)])
def test_output_shape_splits_padding_as_the_spec_says(auto_pad, first):
    # full output 2 * 3 + 3 = 9 cropped to 8: the odd cell comes off the end for SAME_UPPER and
    # off the beginning otherwise (spec and onnxruntime; the reference ignores output_shape
    # under NOTSET)
    x, w = _random((1, 1, 4), 9), _random((1, 1, 3), 10)
    attrs = {"strides": [2], "output_shape": [8]}
    # explicit pads are ignored (onnxruntime refuses them next to an auto_pad)
    attrs.update({"pads": [3, 3]} if auto_pad == "NOTSET" else {"auto_pad": auto_pad})
    model, feeds = single_node_model("ConvTranspose", [x, w], attrs)
    got = run_engine(model, feeds)[0]
    uncropped = conv_transpose([x, w], {"strides": [2]})[0]
    np.testing.assert_allclose(got, uncropped[:, :, first : first + 8], rtol=1e-6)
    assert_same([got], run_onnxruntime(model, feeds), **TOL)


def test_output_padding_below_dilation_but_not_stride_is_accepted():
    # the spec allows output_padding < dilation; both oracles refuse it, so check by hand: the
    # extra cell at the end receives no tap, only the bias
    x, w, b = _random((1, 2, 4), 11), _random((2, 3, 3), 12), _random((3,), 13)
    plain = conv_transpose([x, w, b], {"dilations": [2]})[0]
    padded = conv_transpose([x, w, b], {"dilations": [2], "output_padding": [1]})[0]
    assert padded.shape == (1, 3, plain.shape[2] + 1)
    np.testing.assert_array_equal(padded[:, :, :-1], plain)
    np.testing.assert_allclose(padded[0, :, -1], b)


def test_read_only_inputs_are_left_untouched():
    x, w, b = _random((1, 3, 4, 4), 14), _random((3, 2, 3, 3), 15), _random((2,), 16)
    for array in (x, w, b):
        array.setflags(write=False)
    copies = [x.copy(), w.copy(), b.copy()]
    conv_transpose([x, w, b], {"strides": [2, 2], "output_padding": [1, 1]})
    for array, copy in zip((x, w, b), copies, strict=True):
        np.testing.assert_array_equal(array, copy)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shapes", "attrs", "message"),
    [
        (
            [(1, 3, 4), (4, 2, 3)],
            {},
            r"W\(4, 2, 3\) is laid out \(C, M/group, k\.\.\.\) for C=4 .* X\(1, 3, 4\) has 3",
        ),
        ([(1, 3, 4), (3, 2, 3)], {"group": 2}, "X has 3 channels, which group=2 does not divide"),
        ([(1, 3, 4), (3, 2, 3, 3)], {}, "same rank >= 3"),
        ([(1, 3, 4), (3, 2, 3), (3,)], {}, r"bias B\(3,\) must have shape \(2,\)"),
        ([(1, 3, 4), (3, 2, 3)], {"kernel_shape": [2]}, r"kernel_shape \[2\] does not match W\(3, 2, 3\)"),
        ([(1, 3, 4, 4), (3, 2, 3, 3)], {"pads": [1, 1]}, r"pads \[1, 1\] must have 4 values"),
        ([(1, 3, 4, 4), (3, 2, 3, 3)], {"strides": [2]}, r"strides \[2\] must have 2 values"),
        ([(1, 3, 4, 4), (3, 2, 3, 3)], {"output_padding": [1]}, r"output_padding \[1\] must have 2 values"),
        ([(1, 3, 4), (3, 2, 3)], {"output_shape": [1, 2, 9]}, r"output_shape \[1, 2, 9\] must have 1 values"),
        (
            [(1, 3, 4), (3, 2, 3)],
            {"strides": [2], "output_shape": [11]},
            r"output_shape 11 is larger .*\(at most 10",
        ),
        ([(1, 3, 2), (3, 2, 3)], {"pads": [2, 2]}, "output would be empty along spatial axis 0"),
    ],
    ids=[
        "channels",
        "group",
        "rank",
        "bias",
        "kernel_shape",
        "pads",
        "strides",
        "output_padding_len",
        "output_shape_len",
        "output_shape_too_large",
        "empty",
    ],
)
def test_bad_shapes_are_refused_with_the_mismatch(shapes, attrs, message):
    inputs = [_random(shape, i) for i, shape in enumerate(shapes)]
    with pytest.raises(ValueError, match=message):
        conv_transpose(inputs, attrs)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"strides": [2], "output_padding": [2]}, r"output_padding \[2\] must be less than the stride 2 or"),
        ({"dilations": [2], "output_padding": [2]}, r"output_padding \[2\] .* stride 1 or the dilation 2 on"),
    ],
    ids=["stride", "dilation"],
)
def test_output_padding_not_below_stride_or_dilation_is_refused(attrs, message):
    with pytest.raises(ValueError, match=message):
        conv_transpose([_random((1, 1, 4), 0), _random((1, 1, 3), 1)], attrs)


def test_mismatched_channels_fail_naming_the_node():
    model, feeds = single_node_model("ConvTranspose", [_random((1, 3, 4), 0), _random((2, 2, 3), 1)])
    with pytest.raises(
        NodeExecutionError, match=r"node 'the_convtranspose' \(ConvTranspose\).*X\(1, 3, 4\) has 3"
    ):
        run_engine(model, feeds)


def test_bad_auto_pad_is_refused_at_load_naming_the_node():
    model, feeds = single_node_model(
        "ConvTranspose", [_random((1, 3, 4), 0), _random((3, 2, 3), 1)], {"auto_pad": "SAME"}
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = write_model_package(model, Path(tmp) / "m.ferry", feeds)
        with pytest.raises(UnsupportedOperatorError) as info:
            Session(path)
    message = str(info.value)
    assert "node 'the_convtranspose'" in message
    assert "auto_pad 'SAME' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID" in message
