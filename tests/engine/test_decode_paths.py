"""Hypothesis: the one-row fast paths a decode step takes (LayerNorm of one row, QMatMul and
FusedMatMul of one input row, FusedAttention of one query, Reshape's shape decoding) against
onnx's ReferenceEvaluator or the general path, on shapes that take them and shapes that don't."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from converter import quantize as quant
from engine.ops import fused, normalization, quantized
from engine.ops.normalization import layer_normalization, prepare_layer_norm
from engine.ops.shape import reshape
from tests.engine.helpers import (
    assert_same,
    run_engine,
    run_int8_matmul_reference,
    run_reference,
    single_node_model,
)

SETTINGS = settings(max_examples=40, deadline=None)


def _array(seed: int, shape: tuple[int, ...], scale: float = 1.0, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype=dtype)


def _spy(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Count the calls of ``module.name`` (the fast path under test) while still running it."""
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


# one row: (n,), (1, n), (1, 1, n)...; several rows: some leading dim above 1
one_row = st.tuples(st.integers(0, 3), st.integers(1, 600)).map(lambda c: (1,) * c[0] + (c[1],))
rows = st.tuples(
    st.lists(st.integers(1, 4), min_size=1, max_size=3).filter(lambda d: math.prod(d) > 1), st.integers(1, 40)
).map(lambda c: (*c[0], c[1]))


# -- LayerNormalization of one row -------------------------------------------------------------


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.one_of(one_row, rows),
    st.booleans(),
    st.sampled_from([1, 3]),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from([0.0, 5.0, 300.0]),
)
def test_layer_norm_one_row_matches_reference(seed, shape, with_bias, n_outputs, dtype, offset):
    x = _array(seed, shape, 2.0, dtype) + dtype(offset)
    n = shape[-1]
    scale = _array(seed + 1, (n,), 1.0, dtype)
    bias = _array(seed + 2, (n,), 1.0, dtype) if with_bias else None
    inputs = [x, scale] + ([bias] if with_bias else [])
    model, feeds = single_node_model("LayerNormalization", inputs, {"axis": -1}, n_outputs=n_outputs)
    want = run_reference(model, feeds)
    # as in test_transformer_kernels: rows far from zero mean lose digits to cancellation
    inv_std = 1 / np.sqrt(x.astype(np.float64).var(axis=-1) + 1e-5)
    conditioning = np.max(np.abs(x)) * np.max(inv_std) * np.max(np.abs(scale))
    atol = (1e-5 if dtype == np.float32 else 1e-9) + 16 * np.finfo(dtype).eps * conditioning
    rtol = 1e-5 if dtype == np.float32 else 1e-7
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "FERRY_JIT", "0"
        )  # the numpy kernel's one-row path (a JIT LayerNorm rides where numba is loaded)
        calls = _spy(mp, normalization, "_layer_norm_row")
        assert_same(run_engine(model, feeds), want, rtol=rtol, atol=atol)  # through prepare: stats iff used
    assert bool(calls) == (math.prod(shape) == n)
    attrs = prepare_layer_norm({"axis": -1}, len(inputs), n_outputs)
    assert attrs["stats"] == (n_outputs > 1)
    assert_same(layer_normalization(inputs, attrs)[:n_outputs], want, rtol=rtol, atol=atol)
    full = layer_normalization(inputs, {"axis": -1})  # attrs not prepared: all three outputs
    assert len(full) == 3
    assert_same(
        full, run_reference(*single_node_model("LayerNormalization", inputs, {}, n_outputs=3)), rtol, atol
    )


def test_layer_norm_one_row_of_a_constant_and_a_strided_row():
    x = np.full((1, 1, 8), 3.0, np.float32)
    scale, bias = np.ones(8, np.float32), np.arange(8, dtype=np.float32)
    (y,) = layer_normalization([x, scale, bias], {"epsilon": 1e-5, "stats": 0})
    np.testing.assert_array_equal(y, bias.reshape(1, 1, 8))  # zero variance: just the bias
    wide = _array(3, (1, 16))
    strided = wide[:, ::2]  # one row, not contiguous
    want = layer_normalization([np.ascontiguousarray(strided), scale, bias], {})
    assert_same(layer_normalization([strided, scale, bias], {}), want, rtol=0, atol=0)
    assert not np.shares_memory(layer_normalization([x, scale, None], {})[0], x)


# -- QMatMul and FusedMatMul of one input row --------------------------------------------------


def _gelu(y: np.ndarray) -> np.ndarray:
    return 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))


ACTIVATE = {None: lambda y: y, "Relu": lambda y: np.maximum(y, 0), "Gelu": _gelu}


@st.composite
def row_matmul_cases(draw):
    k, n = draw(st.integers(1, 70)), draw(st.integers(1, 40))
    lead = draw(st.sampled_from([(), (1,), (1, 1), (2,), (3, 1), (1, 2)]))
    seed = draw(st.integers(0, 2**32 - 1))
    bias = _array(seed + 2, (n,)) if draw(st.booleans()) else None
    return _array(seed, (k, n)), _array(seed + 1, (*lead, k)), bias, draw(st.sampled_from(list(ACTIVATE)))


def _attrs(activation: str | None, **more: object) -> dict:
    return {**more, **({"activation": activation, "activation_attrs": {}} if activation else {})}


@SETTINGS
@given(row_matmul_cases(), st.sampled_from([4, 4 << 20]))
def test_int8_qmatmul_one_row_matches_dequantize_then_matmul(case, scratch):
    weight, a, bias, activation = case
    q, scale = quant.quantize_int8(weight, 1)
    full = quantized.dequantize(q, scale, None, {"axis": 1}).astype(np.float64)
    want = ACTIVATE[activation](a.astype(np.float64) @ full + (0 if bias is None else bias))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", scratch)
        calls = _spy(mp, quantized, "_one_row_int8")
        (got,) = quantized.qmatmul([a, q, scale, None, bias], _attrs(activation, axis=1))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * a.shape[-1] * max(1.0, np.abs(want).max()))
    assert bool(calls) == (a.size == a.shape[-1] and q.size * 4 <= scratch)


def test_int8_qmatmul_one_row_equals_onnx_reference():
    k, n = 64, 24
    weight, a, bias = _array(1, (k, n)), _array(2, (1, 1, k)), _array(3, (n,))
    q, scale = quant.quantize_int8(weight, 1)
    want = run_int8_matmul_reference(q, scale, a, bias, "Gelu")
    (got,) = quantized.qmatmul([a, q, scale, None, bias], _attrs("Gelu", axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_int8_qmatmul_one_row_rejects_a_mismatched_row():
    q, scale = quant.quantize_int8(_array(1, (8, 4)), 1)
    for a in (_array(2, (8, 1)), _array(2, (1, 7))):  # size K but the wrong last dim; short row
        with pytest.raises(ValueError):
            quantized.qmatmul([a, q, scale], {"axis": 1})


@SETTINGS
@given(row_matmul_cases(), st.sampled_from(["vector", "row", "tiled"]))
def test_fused_matmul_one_row_matches_reference(case, bias_form):
    weight, a, bias, activation = case
    want = ACTIVATE[activation](a.astype(np.float64) @ weight + (0 if bias is None else bias))
    given_bias = bias
    if bias is not None and bias_form == "row" and a.ndim > 1:  # [1, N]: the general path's broadcast
        given_bias = bias.reshape(1, -1)
    elif bias is not None and bias_form == "tiled":  # the planner's packed form
        given_bias = np.tile(bias, fused.BIAS_ROWS)
    with pytest.MonkeyPatch.context() as mp:
        calls = _spy(mp, fused, "_one_row_matmul")
        (got,) = fused.fused_matmul([a, weight, given_bias], _attrs(activation))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * a.shape[-1] * max(1.0, np.abs(want).max()))
    one_row = a.size == a.shape[-1]
    assert bool(calls) == (one_row and (given_bias is None or given_bias.ndim == 1))


def test_fused_matmul_one_row_against_onnx_reference():
    weight, a, bias = _array(1, (48, 20)), _array(2, (1, 1, 48)), _array(3, (20,))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["a", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["hb"]),
            helper.make_node("Gelu", ["hb"], ["y"]),
        ],
        "matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    (want,) = ReferenceEvaluator(model).run(None, {"a": a})
    (got,) = fused.fused_matmul([a, weight, bias], _attrs("Gelu"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- QGather of one token ----------------------------------------------------------------------


@SETTINGS
@given(
    st.integers(1, 30),
    st.integers(1, 20),
    st.integers(0, 2**32 - 1),
    st.sampled_from([(), (1,), (1, 1), (2,), (1, 3)]),
    st.sampled_from([np.int64, np.int32]),
)
def test_int8_qgather_one_index_matches_reference(height, width, seed, index_shape, index_type):
    q, scale = quant.quantize_int8(_array(seed, (height, width)), 0)
    rng = np.random.default_rng(seed)
    indices = rng.integers(-height, height, index_shape).astype(index_type)
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["q", "scale"], ["table"], axis=0),
            helper.make_node("Gather", ["table", "indices"], ["y"], axis=0),
        ],
        "qgather",
        [
            helper.make_tensor_value_info(
                "indices", helper.np_dtype_to_tensor_dtype(indices.dtype), index_shape
            )
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    (want,) = ReferenceEvaluator(model).run(None, {"indices": indices})
    with pytest.MonkeyPatch.context() as mp:
        calls = _spy(mp, quantized, "_one_qrow")
        (got,) = quantized.qgather([q, scale, None, indices], {"axis": 0})
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert bool(calls) == (indices.size == 1)
    assert not np.shares_memory(got, q)


def test_qgather_one_index_out_of_range_and_other_forms():
    q, scale = quant.quantize_int8(_array(0, (4, 6)), 0)
    for bad in (np.array([[4]]), np.array(-5)):
        with pytest.raises(IndexError, match="out of range"):
            quantized.qgather([q, scale, None, bad], {"axis": 0})
    zero = np.full(4, 3, np.int8)  # a zero point: the general path
    (got,) = quantized.qgather([q, scale, zero, np.array([[2]])], {"axis": 0})
    np.testing.assert_array_equal(got[0, 0], (q[2].astype(np.float32) - 3) * scale[2])


# -- FusedAttention of one query ---------------------------------------------------------------


def _attention_reference(q, k, v, mask, scale):
    scores = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (scores / scores.sum(axis=-1, keepdims=True)) @ v


@st.composite
def one_query_cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    s = draw(st.sampled_from([1, 1, 1, 2, 5]))  # mostly the decode step's one query
    t, d, dv = (draw(st.integers(1, 40)) for _ in range(3))
    seed = draw(st.integers(0, 2**32 - 1))
    q, k, v = (
        _array(seed, (*lead, s, d), 2.0),
        _array(seed + 1, (*lead, t, d), 2.0),
        _array(seed + 2, (*lead, t, dv)),
    )
    mask = None
    mask_shape = draw(st.sampled_from([None, (t,), (s, t), (*lead, s, t), (2, *lead, s, t)]))
    if mask_shape is not None:  # some keys masked out; never all of a row
        mask = np.where(_array(seed + 3, mask_shape) > 1.0, -1e4, 0).astype(np.float32)
        mask[..., 0] = 0
    return q, k, v, mask, draw(st.sampled_from([1.0, 0.125]))


@SETTINGS
@given(one_query_cases(), st.booleans())
def test_fused_attention_one_query_matches_reference(case, k_transposed):
    q, k, v, mask, scale = case
    want = _attention_reference(q, k, v, mask, scale)
    key = np.ascontiguousarray(np.swapaxes(k, -1, -2)) if k_transposed else k
    inputs = [q, key, v] + ([mask] if mask is not None else [])
    attrs = {"scale": scale, "k_transposed": int(k_transposed)}
    with pytest.MonkeyPatch.context() as mp:
        calls = _spy(mp, fused, "_attention_one_query")
        got = fused.fused_attention(inputs, attrs)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    # float32 scores of |q.k| up to ~100 (d 40, entries of scale 2) carry ~1e-5 of absolute
    # rounding, which the softmax turns into relative errors of that size: 1e-5 failed a draw
    # (1.3e-5 at an output of 0.25) on the numpy kernel as on every earlier tree
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert bool(calls) == (q.shape[-2] == 1)
    if mask is None:  # and the per-head kernel agrees
        np.testing.assert_allclose(fused.attention_per_head(inputs, attrs)[0], want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 8), st.integers(2, 30), st.integers(0, 2**32 - 1))
def test_one_query_attention_through_views_matches_reference(heads, dim, t, seed):
    """The decode step's layout: q a strided view of the packed qkv row, the result written
    through ``out_view`` into the head-merged [1, 1, heads * dim] row."""
    width = heads * dim
    qkv = _array(seed, (1, 1, 3 * width))
    k, v = _array(seed + 1, (1, heads, t, dim)), _array(seed + 2, (1, heads, t, dim))
    q_view = {"offset": width, "shape": [1, heads, 1, dim], "strides": [0, dim, 0, 1]}  # the middle third
    out_view = {
        "shape": [1, 1, width],
        "view": {"offset": 0, "shape": [1, heads, 1, dim], "strides": [0, dim, 0, 1]},
    }
    attrs = {"scale": 0.5, "views": [q_view, None, None], "out_view": out_view}
    q = qkv[..., width : 2 * width].reshape(1, heads, 1, dim)
    want = _attention_reference(q, k, v, None, 0.5).reshape(1, 1, width)
    for _ in range(2):  # the second call reuses the parsed views
        got = fused.fused_attention([qkv, k, v], attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    wide = [a.astype(np.float64) for a in (qkv, k, v)]
    got = fused.fused_attention(wide, attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the same spec for another itemsize
    with pytest.raises(ValueError, match="does not fit"):
        fused.fused_attention([qkv[..., : 2 * width - 1], k, v], attrs)


def test_attention_view_specs_are_checked_every_time_they_are_new():
    qkv = _array(0, (2, 12))
    good = {"shape": [1, 2, 2], "offset": 0, "strides": [0, 12, 1]}
    fused.fused_attention([qkv, qkv, qkv], {"views": [good, good, good]})
    for bad in ({**good, "strides": [0, -12, 1]}, {**good, "shape": [1, 0, 2]}, {**good, "offset": -1}):
        with pytest.raises(ValueError):
            fused.fused_attention([qkv, qkv, qkv], {"views": [bad, good, good]})


# -- Reshape's shape input ---------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple),
    st.data(),
    st.sampled_from([np.int64, np.int32]),
)
def test_reshape_matches_reference(shape, data, dtype):
    x = _array(0, shape)
    dims = list(data.draw(st.permutations(shape)))
    if data.draw(st.booleans()):
        dims[data.draw(st.integers(0, len(dims) - 1))] = -1
    if data.draw(st.booleans()):  # 0 copies the input's dim at that position
        position = data.draw(st.integers(0, min(len(dims), len(shape)) - 1))
        if dims[position] == shape[position]:
            dims[position] = 0
    target = np.array(dims, dtype=dtype)
    model, feeds = single_node_model("Reshape", [x, target.astype(np.int64)])
    (want,) = run_reference(model, feeds)
    (got,) = reshape([x, target], {})
    np.testing.assert_array_equal(got, want)
    assert got.shape == want.shape and np.shares_memory(got, x)


def test_reshape_allowzero_and_non_integer_dims():
    x = np.zeros((0, 3), np.float32)
    assert reshape([x, np.array([3, 0], np.int64)], {"allowzero": 1})[0].shape == (3, 0)
    assert reshape([np.zeros((2, 3)), np.array([0, 3], np.int64)], {})[0].shape == (2, 3)
    assert reshape([np.zeros((2, 3)), np.array([3.0, 2.0])], {})[0].shape == (3, 2)
