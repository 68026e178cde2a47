"""Hypothesis: the ops with many attributes, on random shapes and attributes, against the ONNX reference."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from engine.ops import conv, inplace
from tests.engine.helpers import (
    assert_candidates_match,
    assert_same,
    check_op,
    run_engine,
    run_onnxruntime,
    run_reference,
    single_node_model,
)

SETTINGS = settings(max_examples=25, deadline=None)


def _array(draw, shape, scale: float = 1.0) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype=np.float32)


@st.composite
def conv_cases(draw):
    nd = draw(st.integers(1, 2))
    kind = draw(st.sampled_from(["plain", "grouped", "depthwise", "pointwise"]))
    group = {"plain": 1, "pointwise": draw(st.integers(1, 2))}.get(kind, draw(st.integers(2, 3)))
    c_per_group = 1 if kind == "depthwise" else draw(st.integers(1, 3))
    m_per_group = draw(st.integers(1, 3))
    kernel = [1] * nd if kind == "pointwise" else draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    strides = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    dilations = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    spatial = [e + draw(st.integers(0, 4)) for e in extents]
    attrs = {"strides": strides, "dilations": dilations, "group": group}
    if auto_pad == "NOTSET":
        attrs["pads"] = draw(st.lists(st.integers(0, 2), min_size=2 * nd, max_size=2 * nd))
    else:
        attrs["auto_pad"] = auto_pad
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    n = draw(st.integers(1, 2))
    x = _array(draw, (n, group * c_per_group, *spatial))
    w = _array(draw, (group * m_per_group, c_per_group, *kernel))
    b = _array(draw, (group * m_per_group,)) if draw(st.booleans()) else None
    return [x, w] + ([b] if b is not None else []), attrs


@SETTINGS
@given(conv_cases())
def test_conv(case):
    inputs, attrs = case
    check_op("Conv", inputs, attrs, rtol=1e-4, atol=1e-4)


@st.composite
def pool_cases(draw):
    nd = draw(st.integers(1, 2))
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    kernel = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    strides = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    attrs = {"kernel_shape": kernel, "strides": strides}
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    dilations = [1] * nd
    # Dilated SAME pooling is left out: onnxruntime sizes its padding with the undilated
    # kernel, so its output is not the ceil(input / stride) the spec (and the engine) give.
    if op == "MaxPool" and not auto_pad.startswith("SAME") and draw(st.booleans()):
        dilations = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
        attrs["dilations"] = dilations
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel] * 2
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    else:
        attrs["auto_pad"] = auto_pad
        if auto_pad != "VALID":  # both runtimes reject the negative SAME padding of kernel < stride
            attrs["strides"] = [min(s, k) for s, k in zip(strides, kernel, strict=True)]
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    spatial = [e + draw(st.integers(0, 4)) for e in extents]
    return op, _array(draw, (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial)), attrs


@SETTINGS
@given(pool_cases())
def test_pools(case):
    op, x, attrs = case
    model, feeds = single_node_model(op, [x], attrs, opset=19)
    # onnxruntime is the oracle here: the reference evaluator's pooling is wrong in corners
    # this strategy reaches (ceil_mode's extra cells split between both ends, SAME_LOWER with
    # dilations padded like SAME_UPPER, the stride-1 path crashing on some padded inputs).
    # test_ops_reference.py checks the plain cases against the reference evaluator.
    assert_same(run_engine(model, feeds), run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)


@st.composite
def gemm_cases(draw):
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    trans_a, trans_b = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    a = _array(draw, (k, m) if trans_a else (m, k))
    b = _array(draw, (n, k) if trans_b else (k, n))
    c_shape = draw(st.sampled_from([None, (), (n,), (1, n), (m, 1), (m, n)]))
    attrs = {"transA": trans_a, "transB": trans_b}
    if draw(st.booleans()):
        attrs["alpha"] = draw(st.floats(-2, 2, width=32))
    if draw(st.booleans()):
        attrs["beta"] = draw(st.floats(-2, 2, width=32))
    inputs = [a, b] if c_shape is None else [a, b, _array(draw, c_shape)]
    return inputs, attrs


@SETTINGS
@given(gemm_cases())
def test_gemm(case):
    inputs, attrs = case
    check_op("Gemm", inputs, attrs, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(
    st.sampled_from(["Add", "Sub", "Mul", "Div", "Pow"]),
    mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    st.integers(0, 2**32 - 1),
)
def test_elementwise_broadcasting(op, shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes.input_shapes)
    if op in ("Div", "Pow"):
        a = np.abs(a) + np.float32(0.5)
        b = np.abs(b) + np.float32(0.5) if op == "Div" else b
    check_op(op, [a, b], rtol=1e-5, atol=1e-6)


@SETTINGS
@given(st.data())
def test_softmax(data):
    shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    op = data.draw(st.sampled_from(["Softmax", "LogSoftmax"]))
    # Large logits check the max-shift; LogSoftmax stays moderate because the reference
    # computes log(softmax), which underflows to -inf where the engine stays finite.
    scale = data.draw(st.sampled_from([1.0, 30.0] if op == "Softmax" else [1.0, 5.0]))
    x = _array(data.draw, tuple(shape), scale=scale)
    check_op(op, [x], {"axis": axis}, opset=13, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(st.data())
def test_reduce_mean_is_np_mean_bit_for_bit(data):
    """ReduceMean's float path (a sum, then the division) gives np.mean's bits, over views of
    any layout (a conv's channels-last result), empty axes' NaN included; and the reference's."""
    from engine.ops.registry import REGISTRY  # noqa: PLC0415

    shape = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.float16]))
    x = (_array(data.draw, tuple(shape)) * 10).astype(dtype)
    if x.ndim > 1 and data.draw(st.booleans()):  # axis 1 contiguous: a channels-last conv's result
        x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
    axes = data.draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True))
    keepdims = data.draw(st.sampled_from([0, 1]))
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # np.mean's "Mean of empty slice"
        got = REGISTRY["ReduceMean"]([x], {"axes": axes, "keepdims": keepdims})[0]
        want = np.mean(x, axis=tuple(axes), keepdims=bool(keepdims))
    assert got.dtype == x.dtype and np.array_equal(got, want.astype(x.dtype), equal_nan=True)
    if x.size and dtype == np.float32:
        check_op("ReduceMean", [x], {"axes": axes, "keepdims": keepdims}, opset=13, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(st.data())
def test_transpose_and_reshape(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    x = _array(data.draw, tuple(shape))
    perm = data.draw(st.permutations(range(len(shape))))
    check_op("Transpose", [x], {"perm": list(perm)})
    # Reshape to a random regrouping of the dims, with one -1 and some 0s (copy the input dim).
    target = list(np.random.default_rng(len(shape)).permutation(shape))
    target = [int(d) for d in target]
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    zeros = [i for i, d in enumerate(target) if i < len(shape) and d == shape[i] and d != -1]
    for i in zeros[: data.draw(st.integers(0, len(zeros)))]:
        target[i] = 0
    check_op("Reshape", [x, np.array(target, dtype=np.int64)])


@SETTINGS
@given(st.data())
def test_slice(data):
    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    x = _array(data.draw, tuple(shape))
    axes = data.draw(
        st.lists(
            st.integers(-len(shape), len(shape) - 1),
            min_size=1,
            max_size=len(shape),
            unique_by=lambda a: a % len(shape),
        )
    )
    bound = st.integers(-8, 8) | st.sampled_from([2**62, -(2**62)])
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    as_i64 = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    model, feeds = single_node_model("Slice", [x, as_i64(starts), as_i64(ends), as_i64(axes), as_i64(steps)])
    # With a negative step the reference clamps like Python slicing; the ONNX spec (and
    # onnxruntime) clamp a start before the beginning to 0, which still selects element 0.
    oracle = run_reference if all(step > 0 for step in steps) else run_onnxruntime
    assert_same(run_engine(model, feeds), oracle(model, feeds), rtol=0, atol=0)


@SETTINGS
@given(st.data())
def test_top_k(data):
    """Ties (values drawn from a few integers) must come out in index order, NaN as the largest."""
    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[axis]))
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int64, np.int32]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    if dtype in (np.float32, np.float64) and data.draw(st.booleans()):
        x[rng.random(shape) < 0.2] = np.nan
    attrs = {"axis": axis, "largest": data.draw(st.integers(0, 1)), "sorted": data.draw(st.integers(0, 1))}
    k_input = np.array([k], np.int64)
    values, indices = check_op("TopK", [x, k_input], attrs, n_outputs=2, opset=11, rtol=0, atol=0)
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(values, np.take_along_axis(x, indices, axis=axis))


@SETTINGS
@given(conv_cases())
def test_every_conv_kernel_the_search_may_pick_agrees_with_the_reference(case):
    """Each candidate (im2col, 1x1, Winograd, three depthwise forms) on its own, weights pre-packed
    the way a plan packs them, against the ONNX reference."""
    inputs, attrs = case
    model, feeds = single_node_model("Conv", inputs, attrs)
    want = run_reference(model, feeds)[0]
    shapes = [a.shape for a in inputs]
    candidates = conv.conv_candidates(attrs, shapes)
    assert candidates[0] is conv.select_conv(attrs, shapes)
    assert_candidates_match(candidates, inputs, attrs, want, 1e-4)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 6),
    m=st.integers(1, 6),
    size=st.integers(3, 12),
    pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_winograd_matches_the_reference(n, c, m, size, pads, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, size, size + 1)).astype(np.float32)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"pads": pads}
    model, feeds = single_node_model("Conv", [x, w, b], attrs)
    got = conv.conv_winograd([x, conv.pack_winograd(w), b], attrs)[0]
    np.testing.assert_allclose(got, run_reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]))
def test_fast_gelu_is_exact_gelu(seed, dtype):
    x = (np.random.default_rng(seed).standard_normal(257) * 6).astype(dtype)
    x[:4] = [0.0, -0.0, 40.0, -40.0]
    model, feeds = single_node_model("Gelu", [x], {}, opset=20)
    want = run_reference(model, feeds)[0]
    got = inplace.gelu([x], {})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    again = x.copy()
    inplace.gelu_inplace([again], {})
    np.testing.assert_array_equal(again, got)
