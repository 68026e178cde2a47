"""Hypothesis: MatMul and FusedMatMul on the JIT GEMM with plan-packed weights
(engine/ops/matmul_jit.py), on its 6 x 32 tiles and its 6 x 16 ones (AVX2), against the numpy
kernels and onnx's ReferenceEvaluator: shapes around the tiles, bias, Relu / Clip in the tiles,
GELU after (a JIT pass), edge values; and the plan packing the weights once for the kernel the
search picks."""

from __future__ import annotations

from types import SimpleNamespace

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


# each width's FusedMatMul, FusedMatMul shared out in row chunks, and MatMul kernels
WIDTHS = {
    "6x32": ("fused_matmul_gemm_jit", "fused_matmul_shared_jit", "matmul_gemm_jit"),
    "6x16": ("fused_matmul_gemm8_jit", "fused_matmul_shared8_jit", "matmul_gemm8_jit"),
}


@pytest.fixture(scope="module")
def matmul_jit():
    return jit_tier.module("engine.ops.matmul_jit")


@pytest.fixture(scope="module", params=list(WIDTHS))
def tiles(request, matmul_jit):
    """One width's kernels, and ``pack``: its plan's packing of the weights."""
    fused, shared, matmul = (getattr(matmul_jit, name) for name in WIDTHS[request.param])
    return SimpleNamespace(fused=fused, shared=shared, matmul=matmul, pack=lambda i, a: fused.pack(i, a)[1])


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
def test_fused_matmul_matches_numpy_and_the_reference(tiles, case, prepacked, two_threads):
    a, w, bias, activation = case
    attrs = attrs_of(activation)
    inputs = [a, w] + ([bias] if bias is not None else [])
    want = fused_matmul(inputs, attrs)[0]
    ref = reference(a, w, bias, activation)
    if prepacked:
        inputs[1] = tiles.pack(inputs, attrs)
    with jit_tier.thread_limit(2 if two_threads else 1):
        got = tiles.fused(inputs, attrs)[0]
    assert got.shape == want.shape == ref.shape and got.dtype == np.float32
    # float32 sums over K in another order: rounding of ~eps * sum |a| |w|, checked per element
    scale = np.abs(a) @ np.abs(w) + (0 if bias is None else np.abs(bias))
    allowed = 4 * np.finfo(np.float32).eps * (scale + 1) + 2e-6 * np.abs(ref)
    assert np.all(np.abs(got - ref) <= allowed)
    assert np.all(np.abs(got - want) <= allowed)
    with jit_tier.thread_limit(2 if two_threads else 1):  # rows shared out in chunks: the same sums
        shared = tiles.shared(inputs, attrs)[0]
    np.testing.assert_array_equal(shared, got)


@SETTINGS
@given(cases())
def test_matmul_matches_numpy_packed_or_not(tiles, case):
    a, w, _, _ = case
    want = a @ w
    scale = np.abs(a) @ np.abs(w)
    for weights in (w, tiles.pack([a, w], {})):
        got = tiles.matmul([a, weights], {})[0]
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= 4 * np.finfo(np.float32).eps * (scale + 1))


def test_nan_and_infinity_reach_their_rows_only(tiles):
    a = np.ones((20, 8), np.float32)
    a[3, 2], a[7, 0] = np.nan, np.inf
    w = np.abs(np.random.default_rng(1).standard_normal((8, 40))).astype(np.float32)
    got = tiles.fused([a, w], {"activation": "Relu"})[0]
    want = fused_matmul([a, w], {"activation": "Relu"})[0]
    assert np.all(np.isnan(got[3])) and np.all(np.isinf(got[7]))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.delete(got, [3, 7], 0), np.delete(want, [3, 7], 0), rtol=1e-6)


def test_gelu_after_the_gemm_keeps_the_formula_at_edge_values(tiles):
    """The exact GELU after the GEMM is rows_jit's JIT pass: its limits (gelu(-inf) NaN,
    gelu(+inf) inf, far negative 0, far positive x) and NaN as the erf formula's."""
    edges = np.array([0.0, -0.0, 1e-30, -1e-30, 5.9999, 6.0, -6.0001, 40.0, -40.0, 1e30, -1e30], np.float32)
    a = np.zeros((len(edges) + 3, 1), np.float32)
    a[: len(edges), 0] = edges
    a[-3:, 0] = np.inf, -np.inf, np.nan
    w = np.ones((1, 20), np.float32)
    attrs = {"activation": "Gelu", "activation_attrs": {}}
    for weights in (w, tiles.pack([a, w], attrs)):
        got = tiles.fused([a, weights], attrs)[0]
        with np.errstate(invalid="ignore"):  # the reference's own inf * 0 (its NaN is the answer)
            want = reference(a, w, None, ("Gelu", {}))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(got, fused_matmul([a, w], attrs)[0], rtol=2e-6, atol=1e-6)


def test_other_inputs_fall_back_and_packed_weights_unpack(matmul_jit, tiles):
    rng = np.random.default_rng(2)
    a, w = rng.standard_normal((30, 12)), rng.standard_normal((12, 33))
    got = tiles.fused([a, w], {})[0]  # float64: numpy's kernel
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, a @ w)
    a32, w32 = a.astype(np.float32), w.astype(np.float32)
    packed = tiles.pack([a32, w32], {})
    np.testing.assert_array_equal(matmul_jit._unpacked([a32, packed])[1], w32)
    one = tiles.matmul([a32[:1, None, :].astype(np.float64), packed], {})[0]
    np.testing.assert_allclose(one, a[:1, None, :].astype(np.float32) @ w32, rtol=1e-5)


def test_weights_packed_for_one_width_run_on_that_widths_gemm(matmul_jit):
    """A plan's packed weights say their width: any product kernel given them runs the GEMM
    they were packed for (a plan built on another width's choice still runs right)."""
    rng = np.random.default_rng(4)
    a, w = rng.standard_normal((50, 70)).astype(np.float32), rng.standard_normal((70, 41)).astype(np.float32)
    want = matmul_jit.fused_matmul_gemm_jit([a, w], {})[0]
    for packer in (matmul_jit.fused_matmul_gemm_jit, matmul_jit.fused_matmul_gemm8_jit):
        packed = packer.pack([a, w], {})[1]
        for kernel in (matmul_jit.fused_matmul_gemm_jit, matmul_jit.fused_matmul_gemm8_jit):
            np.testing.assert_allclose(kernel([a, packed], {})[0], want, rtol=1e-5, atol=1e-5)


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
    tiled = [matmul_jit.fused_matmul_gemm_jit, matmul_jit.fused_matmul_gemm8_jit]  # both widths
    assert offer({}, [(2, 1024, 64), (64, 512), (512,)]) == tiled
    with jit_tier.thread_limit(2):  # shared out only where the session allows two threads
        shared = [matmul_jit.fused_matmul_shared_jit, matmul_jit.fused_matmul_shared8_jit]
        assert offer({}, [(2, 1024, 64), (64, 512), (512,)]) == tiled + shared
        assert offer({}, [(1, 20, 64), (64, 512)]) == tiled
    assert offer({}, [(1, 1, 64), (64, 512)]) == []  # a decode step: the GEMV paths
    assert offer({}, [(2, 8, 1024, 64), (2, 8, 64, 1024)]) == []  # batched weights
    products = [matmul_jit.matmul_gemm_jit, matmul_jit.matmul_gemm8_jit]
    assert matmul_jit.CANDIDATES["MatMul"]({}, [(77, 256), (256, 256)]) == products
