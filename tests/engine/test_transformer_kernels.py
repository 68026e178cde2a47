"""Hypothesis: the transformer kernels (GELU, LayerNorm, FusedAttention, Raster views) against
onnx's ReferenceEvaluator on random shapes and values."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter import convert
from engine import Session
from engine.format import read_package
from engine.kernels import NUMPY as CANDIDATES
from engine.ops import fastmath, fused, inplace, raster
from engine.ops.fastmath import forced_forms
from engine.ops.normalization import layer_normalization
from tests.converter.models import fvalue, model
from tests.engine.helpers import assert_same, run_engine, run_reference, single_node_model

SETTINGS = settings(max_examples=30, deadline=None)


def _array(seed: int, shape: tuple[int, ...], scale: float = 1.0, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype=dtype)


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


# -- GELU --------------------------------------------------------------------------------------


# Every form fastmath may pick on some machine, each checked here whatever this machine picks.
def _gelu_chosen(natural_exp: bool, table_gelu: bool):
    def gelu_into(x, out):
        with forced_forms(natural_exp, table_gelu):
            return fastmath.gelu_into(x, out)

    return gelu_into


GELU_FORMS = {
    "chosen here": fastmath.gelu_into,
    "chosen: table": _gelu_chosen(True, True),  # float16 / float64 must still avoid the table
    "chosen: polynomial, exp": _gelu_chosen(True, False),
    "chosen: polynomial, exp2": _gelu_chosen(False, False),
    "table": fastmath.gelu_table_into,
    "polynomial-exp": lambda x, out: fastmath.gelu_polynomial_into(x, out, natural=True),
    "polynomial-exp2": lambda x, out: fastmath.gelu_polynomial_into(x, out, natural=False),
}
FLOAT32_ONLY = {"table"}


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    shapes,
    st.sampled_from([0.5, 3.0, 12.0]),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from(sorted(GELU_FORMS)),
)
def test_gelu_matches_reference(seed, shape, scale, dtype, form):
    if form in FLOAT32_ONLY:
        dtype = np.float32
    x = _array(seed, shape, scale, dtype)
    model, feeds = single_node_model("Gelu", [x], {}, opset=20)
    want = run_reference(model, feeds)[0]
    gelu_into = GELU_FORMS[form]
    got = gelu_into(x, np.empty_like(x))
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    again = x.copy()
    assert gelu_into(again, again) is again
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("form", sorted(GELU_FORMS))
def test_gelu_limits_and_special_values(form):
    x = np.array(
        [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            5.9999,
            -5.9999,
            6.0,
            -6.0,
            8.0,
            -8.0,
            40.0,
            -40.0,
            1e30,
            -1e30,
            np.inf,
            np.nan,
        ],
        np.float32,
    )
    model, feeds = single_node_model("Gelu", [x], {}, opset=20)
    want = run_reference(model, feeds)[0]
    gelu_into = GELU_FORMS[form]
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no warning escapes the kernel
        got = gelu_into(x, np.empty_like(x))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.isnan(gelu_into(np.array([-np.inf], np.float32), np.empty(1, np.float32))[0])


@pytest.mark.parametrize("form", sorted(GELU_FORMS))
def test_gelu_error_is_absolute_in_the_negative_tail(form):
    """What every form promises: within 6e-7 of the erf formula everywhere, and no worse than 0
    where gelu is tinier than that (gelu(-7) = -9e-12 may come out as 0 or as -2e-37)."""
    x = np.linspace(-12, 4, 16001, dtype=np.float32)
    want = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])
    got = GELU_FORMS[form](x, np.empty_like(x)).astype(np.float64)
    assert np.max(np.abs(got - want)) < 6e-7
    assert np.all(np.sign(got) * np.sign(want) >= 0)  # never the wrong sign
    assert np.all(np.abs(got) <= np.abs(want) + 6e-7)


def test_gelu_of_a_scalar_and_of_float16():
    x = np.array(1.5, np.float32)
    assert fastmath.gelu_into(x, np.empty((), np.float32)) == pytest.approx(
        1.5 * 0.5 * (1 + math.erf(1.5 / 2**0.5))
    )
    half = np.linspace(-8, 8, 33).astype(np.float16)
    want = np.array([v * 0.5 * (1 + math.erf(v / 2**0.5)) for v in half.astype(np.float64)])
    np.testing.assert_allclose(fastmath.gelu_into(half, np.empty_like(half)), want, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("form", ["natural", "chosen"])
def test_exp2_forms_match_numpy(form):
    # exp(x ln 2) loses |x ln 2| float32 roundings of the exponent: ~3e-6 relative at |x| = 64,
    # the most a softmax score reaches unshifted.
    x = np.linspace(-64, 64, 4097, dtype=np.float32)
    got = fastmath._exp2_natural(x) if form == "natural" else fastmath.exp2(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.exp2(x.astype(np.float64)), rtol=1e-5)
    for scalar in (np.float32(3.0), np.array(3.0, np.float32)):  # 0-d, with no out
        value = fastmath._exp2_natural(scalar) if form == "natural" else fastmath.exp2(scalar)
        assert value == pytest.approx(8.0, rel=1e-6)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 70))
def test_fused_matmul_gelu_matches_reference(seed, rows, cols):
    a, w, b = _array(seed, (rows, 16)), _array(seed + 1, (16, cols)), _array(seed + 2, (cols,))
    x = a @ w + b
    model, feeds = single_node_model("Gelu", [x], {}, opset=20)
    got = fused.fused_matmul([a, w, b], {"activation": "Gelu", "activation_attrs": {}})[0]
    np.testing.assert_allclose(got, run_reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 90), st.sampled_from([None, "Gelu"]))
def test_fused_matmul_with_tiled_bias_matches_reference(seed, batch, rows, activation):
    a, w, b = _array(seed, (batch, rows, 8)), _array(seed + 1, (8, 1100)), _array(seed + 2, (1100,))
    attrs = {"activation": activation, "activation_attrs": {}} if activation else {}
    model, feeds = single_node_model(activation or "Identity", [a @ w + b], {}, opset=20)
    want = run_reference(model, feeds)[0]
    packed = fused.pack_fused_matmul([a, w, b], attrs)
    assert (2 in packed) == (batch * rows >= 2 * fused.BIAS_ROWS and batch * rows * 1100 >= 1 << 16)
    for bias in (b, packed.get(2, b)):
        got = fused.fused_matmul([a, w, bias], attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- LayerNormalization ------------------------------------------------------------------------


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    shapes,
    st.booleans(),
    st.sampled_from([-1, 0]),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from([0.1, 1.0, 50.0]),
)
def test_layer_norm_matches_reference(seed, shape, with_bias, axis, dtype, offset):
    x = _array(seed, shape, 3.0, dtype) + dtype(offset)
    normalized = shape[axis:] if axis == 0 else shape[-1:]
    scale = _array(seed + 1, normalized, 1.0, dtype)
    bias = _array(seed + 2, normalized, 1.0, dtype) if with_bias else None
    inputs = [x, scale] + ([bias] if with_bias else [])
    model, feeds = single_node_model("LayerNormalization", inputs, {"axis": axis}, n_outputs=3)
    want = run_reference(model, feeds)
    # Rows far from zero mean lose digits to cancellation in any float order of operations: the
    # engine's and the reference's roundings may differ by a few ulps of |x| over the row's std.
    conditioning = np.max(np.abs(x)) * np.max(want[2]) * np.max(np.abs(scale))
    atol = (1e-5 if dtype == np.float32 else 1e-9) + 16 * np.finfo(dtype).eps * conditioning
    rtol = 1e-5 if dtype == np.float32 else 1e-7
    assert_same(run_engine(model, feeds), want, rtol=rtol, atol=atol)
    assert_same(layer_normalization(inputs, {"axis": axis}), want, rtol=rtol, atol=atol)


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    shapes,
    st.sampled_from([1.0, -0.5, 3.0]),
    st.sampled_from([None, 0.0, 2.0]),
    st.sampled_from([np.float32, np.float64]),
)
# a near-constant row in float64: the default epsilon must be ONNX's float32 1e-5, as the
# reference's (the double 1e-5 gave 2.5e-7 relative here)
@example(seed=2, shape=(5, 7, 9, 2), scale_value=3.0, bias_value=2.0, dtype=np.float64)
def test_layer_norm_with_uniform_scale_and_bias_packed(seed, shape, scale_value, bias_value, dtype):
    """A scale or bias holding one value is packed as a stride-0 vector and applied as a scalar."""
    x = _array(seed, shape, 3.0, dtype) + dtype(0.5)
    n = shape[-1]
    scale = np.full(n, scale_value, dtype)
    inputs = [x, scale] + ([] if bias_value is None else [np.full(n, bias_value, dtype)])
    packed = layer_normalization.pack(inputs, {})
    assert sorted(packed) == [1, *([2] if bias_value is not None else [])]
    assert all(v.strides == (0,) and np.array_equal(v, inputs[i]) for i, v in packed.items())
    args = [packed.get(i, value) for i, value in enumerate(inputs)]
    model, feeds = single_node_model("LayerNormalization", inputs, {"axis": -1}, n_outputs=3)
    want = run_reference(model, feeds)
    rtol, atol = (1e-5, 1e-5) if dtype == np.float32 else (1e-7, 1e-9)
    assert_same(layer_normalization(args, {"axis": -1}), want, rtol=rtol, atol=atol)


def test_layer_norm_packs_only_vectors_of_one_value():
    x, varied = _array(0, (3, 4)), np.array([1.0, 1.0, 2.0, 1.0], np.float32)
    assert layer_normalization.pack([x, varied, varied + 1], {}) == {}
    assert layer_normalization.pack([x, np.full(4, np.nan, np.float32)], {}) == {}


# -- FusedAttention ----------------------------------------------------------------------------


def _attention_model(q, k, v, mask, scale):
    """MatMul(q, Transpose(k)) * scale [+ mask] -> Softmax -> MatMul(., v), as exporters write it."""
    feeds = {"q": q, "k": k, "v": v, **({"mask": mask} if mask is not None else {})}
    perm = [*range(k.ndim - 2), k.ndim - 1, k.ndim - 2]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]) if mask is not None else None,
        helper.make_node("Softmax", ["masked" if mask is not None else "scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    graph = helper.make_graph(
        [n for n in nodes if n is not None],
        "attention",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, a.shape) for name, a in feeds.items()],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("scale", TensorProto.FLOAT, [], [scale])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


@st.composite
def attention_cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    s, t, d, dv = (draw(st.integers(1, 24)) for _ in range(4))
    seed = draw(st.integers(0, 2**32 - 1))
    q, k = _array(seed, (*lead, s, d), 2.0), _array(seed + 1, (*lead, t, d), 2.0)
    v = _array(seed + 2, (*lead, t, dv))
    mask_shape = draw(st.sampled_from([None, (t,), (s, t), (*lead, s, t)]))
    mask = None
    if mask_shape is not None:  # some positions masked out, as padding masks do
        mask = np.where(_array(seed + 3, mask_shape) > 1.5, -1e4, 0).astype(np.float32)
    scale = draw(st.sampled_from([1.0, 0.125, 1 / math.sqrt(d)]))
    return q, k, v, mask, scale


@SETTINGS
@given(attention_cases(), st.booleans(), st.booleans())
def test_fused_attention_kernels_match_reference(case, k_transposed, natural_exp):
    q, k, v, mask, scale = case
    model, feeds = _attention_model(q, k, v, mask, scale)
    want = run_reference(model, feeds)[0]
    key = np.ascontiguousarray(np.swapaxes(k, -1, -2)) if k_transposed else k
    inputs = [q, key, v] + ([mask] if mask is not None else [])
    attrs = {"scale": scale, "k_transposed": int(k_transposed)}
    shapes = [a.shape for a in inputs]
    kernels = CANDIDATES["FusedAttention"](attrs, shapes)
    assert fused.fused_attention in kernels
    assert (fused.attention_per_head in kernels) == (mask is None)
    for kernel in (fused.fused_attention, fused.attention_per_head):
        with forced_forms(natural_exp, table_gelu=False):  # the base-2 softmax either way
            got = kernel(inputs, attrs)[0]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)


@SETTINGS
@given(attention_cases())
def test_fused_attention_with_q_prescaled_by_log2e(case):
    """q_log2e: q arrives multiplied by the scale and log2(e) (folded into its projection)."""
    q, k, v, mask, scale = case
    model, feeds = _attention_model(q, k, v, mask, scale)
    want = run_reference(model, feeds)[0]
    prescaled = (q.astype(np.float64) * scale * math.log2(math.e)).astype(np.float32)
    inputs = [prescaled, k, v] + ([mask] if mask is not None else [])
    for kernel in (fused.fused_attention, fused.attention_per_head):
        got = kernel(inputs, {"scale": 1.0, "q_log2e": 1})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)


@pytest.mark.parametrize("natural_exp", [True, False])
# scores far above the unshifted softmax's limit (2^64 in its base), and below it (~2^36: the
# exponential then runs on the raw scores, where exp(x ln 2) loses most to rounding)
@pytest.mark.parametrize("level", [30.0, 2.5])
def test_fused_attention_large_scores_stay_finite(natural_exp, level):
    q = np.full((1, 2, 3, 4), level, np.float32)
    k = np.full((1, 2, 5, 4), level, np.float32) + _array(1, (1, 2, 5, 4))
    v = _array(0, (1, 2, 5, 3))
    model, feeds = _attention_model(q, k, v, None, 1.0)
    want = run_reference(model, feeds)[0]
    for kernel in (fused.fused_attention, fused.attention_per_head):
        with forced_forms(natural_exp, table_gelu=False):
            got = kernel([q, k, v], {"scale": 1.0})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float16_attention_with_large_scores_stays_finite():
    """float16's exp overflows at 2^16: its scores always take the max-shifted softmax."""
    rng = np.random.default_rng(2)
    q, k, v = ((rng.standard_normal((1, 2, 6, 8)) * 2.5).astype(np.float16) for _ in range(3))
    wide = [a.astype(np.float32) for a in (q, k, v)]  # the reference, in float32 on the same values
    want = run_reference(*_attention_model(*wide, None, 8**-0.5))[0]
    for kernel in (fused.fused_attention, fused.attention_per_head):
        got = kernel([q, k, v], {"scale": 8**-0.5})[0]
        assert got.dtype == np.float16 and np.all(np.isfinite(got))
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), atol=2e-2, err_msg=kernel.__name__
        )


SHIFTS = st.lists(st.sampled_from([0.0, -40.0, -300.0, 45.0, 300.0]), min_size=1, max_size=24)


@settings(max_examples=20, deadline=None)
@given(attention_cases(), SHIFTS)
def test_fused_attention_is_shift_invariant_per_query(case, shifts):
    """Adding a constant to one query's scores changes nothing: scores far above or below zero
    take the max-shifted path (or are redone with it) instead of overflowing or underflowing."""
    q, k, v, _, scale = case
    model, feeds = _attention_model(q, k, v, None, scale)
    want = run_reference(model, feeds)[0]
    offsets = np.resize(np.array(shifts, np.float32), q.shape[-2]) / scale  # one per query
    shifted_q = np.concatenate([q, np.broadcast_to(offsets[:, None], (*q.shape[:-1], 1))], axis=-1)
    shifted_k = np.concatenate([k, np.ones((*k.shape[:-1], 1), np.float32)], axis=-1)
    for kernel in (fused.fused_attention, fused.attention_per_head):
        got = kernel([shifted_q, shifted_k, v], {"scale": scale})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kernel.__name__)


def test_fused_attention_query_with_every_key_masked():
    """All of one query's scores at -1e4: their exps underflow to 0 unshifted, so that query is
    redone with the max shift and gets the reference's softmax (masking every key is a shift)."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, n, 4)).astype(np.float32) for n in (3, 5, 5))
    mask = np.zeros((3, 5), np.float32)
    mask[1] = -1e4
    model, feeds = _attention_model(q, k, v, mask, 0.5)
    want = run_reference(model, feeds)[0]
    got = fused.fused_attention([q, k, v, mask], {"scale": 0.5})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- Raster views ------------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple), st.data())
def test_raster_block_is_a_read_only_view_equal_to_gather(seed, shape, data):
    x = _array(seed, shape)
    index = data.draw(st.integers(0, shape[0] - 1))
    block = math.prod(shape[1:])
    region = {
        "input": 0,
        "src_offset": index * block,
        "src_strides": [1],
        "dst_offset": 0,
        "dst_strides": [1],
        "size": [block],
    }
    got = raster.raster([x], {"shape": list(shape[1:]), "regions": [region]})[0]
    model, feeds = single_node_model("Gather", [x, np.array(index, np.int64)], {"axis": 0})
    np.testing.assert_array_equal(got, run_reference(model, feeds)[0])
    assert np.shares_memory(got, x) and not got.flags.writeable


def test_raster_copies_strided_regions_and_non_contiguous_inputs():
    x = _array(1, (4, 6))
    transpose = {"input": 0, "src_offset": 0, "src_strides": [1, 6], "dst_offset": 0, "dst_strides": [4, 1]}
    got = raster.raster([x], {"shape": [6, 4], "regions": [{**transpose, "size": [6, 4]}]})[0]
    np.testing.assert_array_equal(got, x.T)
    assert not np.shares_memory(got, x) and got.flags.writeable
    strided = x[:, ::2]
    row = {"input": 0, "src_offset": 3, "src_strides": [1], "dst_offset": 0, "dst_strides": [1], "size": [3]}
    got = raster.raster([strided], {"shape": [3], "regions": [row]})[0]
    np.testing.assert_array_equal(got, strided[1])
    assert not np.shares_memory(got, x)


# -- the converter's attention view folding, end to end against onnxruntime ------------------


def _packed_qkv_attention(batch: int, seq: int, heads: int, dim: int, masked: bool) -> onnx.ModelProto:
    """x @ Wqkv + b -> Reshape [B,S,3,H,D] -> Transpose -> Gather 0/1/2 -> attention -> Transpose
    -> Reshape [B,S,H*D], the way torch exports a packed qkv projection."""
    width = heads * dim
    rng = np.random.default_rng(batch * 1000 + seq * 10 + heads)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["qkv"]),
        helper.make_node("Reshape", ["qkv", "split_shape"], ["split"]),
        helper.make_node("Transpose", ["split"], ["heads"], perm=[2, 0, 3, 1, 4]),
        *(helper.make_node("Gather", ["heads", f"i{n}"], [name], axis=0) for n, name in enumerate("qkv")),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]) if masked else None,
        helper.make_node("Softmax", ["masked" if masked else "scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["attended"]),
        helper.make_node("Transpose", ["attended"], ["merged"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["merged", "merge_shape"], ["y"]),
    ]
    mask = np.where(rng.random((batch, 1, 1, seq)) < 0.3, -1e4, 0.0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((width, 3 * width)).astype(np.float32) * 0.2, "w"),
        numpy_helper.from_array(rng.standard_normal(3 * width).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([batch, seq, 3, heads, dim], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([batch, seq, width], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(1 / math.sqrt(dim), np.float32), "scale"),
        numpy_helper.from_array(mask.astype(np.float32), "mask"),
        *(numpy_helper.from_array(np.array(n, np.int64), f"i{n}") for n in range(3)),
    ]
    return model(
        [n for n in nodes if n is not None],
        [fvalue("x", [batch, seq, width])],
        [fvalue("y", [batch, seq, width])],
        initializers=initializers,
    )


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 2), st.integers(1, 12), st.integers(1, 4), st.integers(1, 8), st.booleans())
def test_attention_views_fold_head_split_and_merge(tmp_path_factory, batch, seq, heads, dim, masked):
    source = _packed_qkv_attention(batch, seq, heads, dim, masked)
    path = tmp_path_factory.mktemp("fold") / "attention.ferry"
    convert(source, path)
    nodes = read_package(path).graph["nodes"]
    attention = next(node for node in nodes if node["op"] == "FusedAttention")
    assert [node["op"] for node in nodes].count("Raster") == 0
    if heads > 1 and seq > 1:  # else the head split and merge are plain reshapes, already free
        assert attention["outputs"] == ["y"]
        assert attention["attrs"]["out_view"]["shape"] == [batch, seq, heads * dim]
        assert [view is not None for view in attention["attrs"]["views"]] == [True, True, True]
        assert attention["attrs"].get("q_log2e", 0) == int(not masked)  # the scale is in the weights
    feeds = {"x": np.random.default_rng(seq).standard_normal((batch, seq, heads * dim)).astype(np.float32)}
    onnxruntime = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    want = onnxruntime.run(None, feeds)
    session = Session(path, threads=1)
    for _ in range(2):  # the recorded run and the planned run
        np.testing.assert_allclose(session.run(feeds)["y"], want[0], rtol=1e-5, atol=1e-5)


def test_attention_views_are_checked_against_the_buffer():
    qkv = _array(0, (2, 12))
    views = [{"shape": [1, 2, 2], "offset": off, "strides": [0, 12, 1]} for off in (0, 4, 8)]
    got = fused.fused_attention([qkv, qkv, qkv], {"views": views})[0]
    q, k, v = (qkv[:, off : off + 2][None] for off in (0, 4, 8))
    np.testing.assert_allclose(got, fused.fused_attention([q, k, v], {})[0], rtol=1e-6, atol=1e-6)
    too_far = [{**views[0], "offset": 11}, views[1], views[2]]
    with pytest.raises(ValueError, match="does not fit"):
        fused.fused_attention([qkv, qkv, qkv], {"views": too_far})


def test_gelu_in_half_precision_is_computed_wide_enough():
    """float16 cannot hold the polynomial's top coefficients: without widening, gelu(6) was 0."""
    x = np.linspace(-10, 10, 401).astype(np.float16)
    wide = x.astype(np.float64)
    want = 0.5 * wide * (1 + np.array([math.erf(v / math.sqrt(2)) for v in wide]))
    for kernel in (inplace.gelu, inplace.gelu_inplace):
        got = kernel([x.copy()], {})[0]
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def _attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    scores = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2)) * scale
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.matmul(scores / scores.sum(axis=-1, keepdims=True), v)


def test_fused_attention_broadcasts_batch_dims_of_v():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, 5, 4), (1, 6, 4), (3, 6, 2)))
    got = fused.fused_attention([q, k, v], {"scale": 0.5})[0]
    assert got.shape == (3, 5, 2)
    np.testing.assert_allclose(got, _attention_reference(q, k, v, 0.5), rtol=1e-5, atol=1e-6)


def test_fused_attention_refuses_an_out_view_that_writes_an_element_twice():
    """A view over the result whose strides overlap would leave other elements uninitialised."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    good = {"shape": [3, 8], "view": {"shape": [2, 3, 4], "offset": 0, "strides": [4, 8, 1]}}
    got = fused.fused_attention([q, k, v], {"out_view": good})[0]
    heads_first = got.reshape(3, 2, 4).transpose(1, 0, 2)
    np.testing.assert_allclose(heads_first, _attention_reference(q, k, v, 1.0), rtol=1e-5, atol=1e-6)
    overlapping = {"shape": [3, 8], "view": {"shape": [2, 3, 4], "offset": 0, "strides": [4, 4, 1]}}
    with pytest.raises(ValueError, match="does not cover its result"):
        fused.fused_attention([q, k, v], {"out_view": overlapping})
