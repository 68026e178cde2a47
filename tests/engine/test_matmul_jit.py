"""Hypothesis: MatMul and FusedMatMul on the JIT GEMM with plan-packed weights
(engine/ops/matmul_jit.py) against the numpy kernels and onnx's ReferenceEvaluator: shapes
around the 6 x 32 tile, bias, Relu / Clip in the tiles, GELU after (a JIT pass), edge values; and the plan
packing the weights once for the kernel the search picks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine import jit as jit_tier
from engine.ops.fused import fused_matmul
from tests.engine.helpers import run_reference

pytestmark = pytest.mark.skipif(not jit_tier.enabled(), reason="numba is not installed (or FERRY_JIT=0)")
SETTINGS = settings(max_examples=40, deadline=None)
ACTIVATIONS = [None, ("Relu", {}), ("Clip", {"min": -0.5, "max": 1.5}), ("Gelu", {})]


@pytest.fixture(scope="module")
def matmul_jit():
    return jit_tier.module("engine.ops.matmul_jit")


@st.composite
def cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    rows, depth, width = draw(st.integers(1, 70)), draw(st.integers(1, 80)), draw(st.integers(1, 100))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((*lead, rows, depth)) * draw(st.sampled_from([1.0, 1e3]))).astype(np.float32)
    w = rng.standard_normal((depth, width)).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32) if draw(st.booleans()) else None
    return a, w, bias, draw(st.sampled_from(ACTIVATIONS))


def reference(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None, activation) -> np.ndarray:
    """MatMul (+ Add) (+ the activation) as ONNX nodes on onnx's ReferenceEvaluator."""
    nodes, last = [helper.make_node("MatMul", ["a", "w"], ["mm"])], "mm"
    feeds = {"a": a, "w": w}
    if bias is not None:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["biased"]))
        feeds["b"], last = bias, "biased"
    if activation is not None:
        name, extra = activation
        if name == "Clip":
            nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
            feeds["lo"], feeds["hi"] = np.float32(extra["min"]), np.float32(extra["max"])
        else:
            nodes.append(helper.make_node(name, [last], ["y"]))
        last = "y"
    graph = helper.make_graph(
        nodes,
        "matmul",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, np.shape(v)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return run_reference(model, feeds)[0]


def attrs_of(activation) -> dict:
    if activation is None:
        return {}
    name, extra = activation
    return {"activation": name, "activation_attrs": extra}


@SETTINGS
@given(cases(), st.booleans(), st.booleans())
def test_fused_matmul_matches_numpy_and_the_reference(matmul_jit, case, prepacked, two_threads):
    a, w, bias, activation = case
    attrs = attrs_of(activation)
    inputs = [a, w] + ([bias] if bias is not None else [])
    want = fused_matmul(inputs, attrs)[0]
    ref = reference(a, w, bias, activation)
    if prepacked:
        inputs[1] = matmul_jit._pack(inputs, attrs)[1]
    with jit_tier.thread_limit(2 if two_threads else 1):
        got = matmul_jit.fused_matmul_gemm_jit(inputs, attrs)[0]
    assert got.shape == want.shape == ref.shape and got.dtype == np.float32
    # float32 sums over K in another order: rounding of ~eps * sum |a| |w|, checked per element
    scale = np.abs(a) @ np.abs(w) + (0 if bias is None else np.abs(bias))
    allowed = 4 * np.finfo(np.float32).eps * (scale + 1) + 2e-6 * np.abs(ref)
    assert np.all(np.abs(got - ref) <= allowed)
    assert np.all(np.abs(got - want) <= allowed)
    with jit_tier.thread_limit(2 if two_threads else 1):  # rows shared out in chunks: the same sums
        shared = matmul_jit.fused_matmul_shared_jit(inputs, attrs)[0]
    np.testing.assert_array_equal(shared, got)


@SETTINGS
@given(cases())
def test_matmul_matches_numpy_packed_or_not(matmul_jit, case):
    a, w, _, _ = case
    want = a @ w
    scale = np.abs(a) @ np.abs(w)
    for weights in (w, matmul_jit._pack([a, w], {})[1]):
        got = matmul_jit.matmul_gemm_jit([a, weights], {})[0]
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= 4 * np.finfo(np.float32).eps * (scale + 1))


def test_nan_and_infinity_reach_their_rows_only(matmul_jit):
    a = np.ones((20, 8), np.float32)
    a[3, 2], a[7, 0] = np.nan, np.inf
    w = np.abs(np.random.default_rng(1).standard_normal((8, 40))).astype(np.float32)
    got = matmul_jit.fused_matmul_gemm_jit([a, w], {"activation": "Relu"})[0]
    want = fused_matmul([a, w], {"activation": "Relu"})[0]
    assert np.all(np.isnan(got[3])) and np.all(np.isinf(got[7]))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.delete(got, [3, 7], 0), np.delete(want, [3, 7], 0), rtol=1e-6)


def test_gelu_after_the_gemm_keeps_the_formula_at_edge_values(matmul_jit):
    """The exact GELU after the GEMM is rows_jit's JIT pass: its limits (gelu(-inf) NaN,
    gelu(+inf) inf, far negative 0, far positive x) and NaN as the erf formula's."""
    edges = np.array([0.0, -0.0, 1e-30, -1e-30, 5.9999, 6.0, -6.0001, 40.0, -40.0, 1e30, -1e30], np.float32)
    a = np.zeros((len(edges) + 3, 1), np.float32)
    a[: len(edges), 0] = edges
    a[-3:, 0] = np.inf, -np.inf, np.nan
    w = np.ones((1, 20), np.float32)
    attrs = {"activation": "Gelu", "activation_attrs": {}}
    for weights in (w, matmul_jit._pack([a, w], attrs)[1]):
        got = matmul_jit.fused_matmul_gemm_jit([a, weights], attrs)[0]
        with np.errstate(invalid="ignore"):  # the reference's own inf * 0 (its NaN is the answer)
            want = reference(a, w, None, ("Gelu", {}))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(got, fused_matmul([a, w], attrs)[0], rtol=2e-6, atol=1e-6)


def test_other_inputs_fall_back_and_packed_weights_unpack(matmul_jit):
    rng = np.random.default_rng(2)
    a, w = rng.standard_normal((30, 12)), rng.standard_normal((12, 33))
    got = matmul_jit.fused_matmul_gemm_jit([a, w], {})[0]  # float64: numpy's kernel
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, a @ w)
    a32, w32 = a.astype(np.float32), w.astype(np.float32)
    packed = matmul_jit._pack([a32, w32], {})[1]
    np.testing.assert_array_equal(matmul_jit._unpacked([a32, packed])[1], w32)
    one = matmul_jit.matmul_gemm_jit([a32[:1, None, :].astype(np.float64), packed], {})[0]
    np.testing.assert_allclose(one, a[:1, None, :].astype(np.float32) @ w32, rtol=1e-5)


def test_shared_rows_cover_every_chunk_once_whoever_takes_them(matmul_jit):
    seen: list[tuple[int, int]] = []
    matmul_jit._shared_rows(lambda first, last: seen.append((first, last)), 197, 2)
    assert sorted(seen) == [(0, 54), (54, 108), (108, 162), (162, 197)]  # whole 6-row tiles
    rng = np.random.default_rng(3)
    a, w = rng.standard_normal((197, 64)).astype(np.float32), rng.standard_normal((64, 40)).astype(np.float32)
    with jit_tier.thread_limit(2):
        got = matmul_jit.fused_matmul_shared_jit([a, w], {})[0]
    np.testing.assert_array_equal(got, matmul_jit.fused_matmul_gemm_jit([a, w], {})[0])


def test_offered_for_fixed_2d_weights_and_enough_rows(matmul_jit):
    offer = matmul_jit.CANDIDATES["FusedMatMul"]
    assert offer({}, [(2, 1024, 64), (64, 512), (512,)]) == [matmul_jit.fused_matmul_gemm_jit]
    with jit_tier.thread_limit(2):  # shared out only where the session allows two threads
        both = [matmul_jit.fused_matmul_gemm_jit, matmul_jit.fused_matmul_shared_jit]
        assert offer({}, [(2, 1024, 64), (64, 512), (512,)]) == both
        assert offer({}, [(1, 20, 64), (64, 512)]) == [matmul_jit.fused_matmul_gemm_jit]
    assert offer({}, [(1, 1, 64), (64, 512)]) == []  # a decode step: the GEMV paths
    assert offer({}, [(2, 8, 1024, 64), (2, 8, 64, 1024)]) == []  # batched weights
    assert matmul_jit.CANDIDATES["MatMul"]({}, [(77, 256), (256, 256)]) == [matmul_jit.matmul_gemm_jit]
