"""gemv_jit (engine/ops/gemv_jit.py): a one-row Gemm by B^T as dot products, against numpy's
Gemm and onnx's ReferenceEvaluator over shapes around its blocks, with and without C, edge
values; the cases it does not take fall back to numpy's kernel; and it is offered only for
them.  Skipped without numba or with FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import jit
from engine.ops.gemm import gemm
from tests.engine.helpers import run_reference, single_node_model

pytestmark = pytest.mark.skipif(not jit.enabled(), reason="numba is not installed (or FERRY_JIT=0)")


@pytest.fixture(scope="module")
def gemv_jit():
    return jit.module("engine.ops.gemv_jit")


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 70),
    st.sampled_from([None, "vector", "row"]),
    st.integers(0, 2**32 - 1),
)
def test_a_one_row_gemm_matches_numpy_and_the_reference(gemv_jit, depth, n, bias, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, depth)).astype(np.float32)
    b = rng.standard_normal((n, depth)).astype(np.float32)
    inputs = [a, b]
    if bias is not None:
        inputs.append(rng.standard_normal(n if bias == "vector" else (1, n)).astype(np.float32))
    attrs = {"transB": 1}
    got = gemv_jit.gemv_jit(inputs, attrs)[0]
    want = gemm(inputs, attrs)[0]
    ref = run_reference(*single_node_model("Gemm", inputs, attrs))[0]
    assert got.shape == want.shape == (1, n) and got.dtype == np.float32
    # float32 sums in another order: ~eps * sum |a| |b| per output
    allowed = 4 * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b).T + 1)
    assert np.all(np.abs(got - want) <= allowed) and np.all(np.abs(got - ref) <= allowed)


def test_nan_and_infinity_reach_their_outputs_only(gemv_jit):
    a = np.ones((1, 40), np.float32)
    b = np.ones((20, 40), np.float32)
    b[3, 7], b[11, 0] = np.nan, np.inf
    got = gemv_jit.gemv_jit([a, b], {"transB": 1})[0][0]
    assert np.isnan(got[3]) and np.isinf(got[11])
    np.testing.assert_array_equal(np.delete(got, [3, 11]), np.full(18, 40, np.float32))


@pytest.mark.parametrize(
    "change",
    [
        {"transB": 0},  # B not transposed
        {"alpha": 0.5},
        {"beta": 2.0},
        {"transA": 1},
    ],
)
def test_other_gemms_take_numpys_kernel(gemv_jit, change):
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((1, 8), (8, 8), (8,)))
    attrs = {"transB": 1} | change
    if attrs.get("transA"):
        a = a.T.copy()
    want = gemm([a, b, c], attrs)[0]
    np.testing.assert_allclose(gemv_jit.gemv_jit([a, b, c], attrs)[0], want, rtol=1e-6, atol=1e-6)
    doubles = [x.astype(np.float64) for x in (a, b, c)]  # float64: numpy's, in float64
    assert gemv_jit.gemv_jit(doubles, attrs)[0].dtype == np.float64


def test_offered_for_one_row_by_a_transposed_b_only(gemv_jit):
    offer = gemv_jit.CANDIDATES["Gemm"]
    assert offer({"transB": 1}, [(1, 1280), (1000, 1280), (1000,)]) == [gemv_jit.gemv_jit]
    assert offer({"transB": 1}, [(4, 1280), (1000, 1280)]) == []  # a batch: BLAS's GEMM
    assert offer({}, [(1, 1280), (1280, 1000)]) == []
    assert offer({"transB": 1}, [None, (1000, 1280)]) == []
