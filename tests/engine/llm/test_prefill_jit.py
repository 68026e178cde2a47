"""Prefill's int4 GEMM in integers on the row-grouped layout (engine/llm/prefill_jit.py: packages
from before the dot layout, dot_jit.py) against the float products."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import jit
from engine.llm import gemv
from engine.llm.weights import make_matrix

pytestmark = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")


def _case(tokens: int, vectors: int, blocks: int, block: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    n, k = 16 * vectors, blocks * block
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 3.0, (n, 1)).astype(np.float32)
    matrix = make_matrix(w, "int4", block, 4, activations="int8")
    x = rng.standard_normal((tokens, k)).astype(np.float32) * rng.uniform(0.1, 10.0, (tokens, 1)).astype(
        np.float32
    )
    return matrix, x


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 9),
    vectors=st.integers(1, 5),
    blocks=st.integers(1, 4),
    block=st.sampled_from([32, 64]),
    tile_vectors=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_the_integer_gemm_matches_the_float_products_of_the_same_rounded_values(
    tokens: int, vectors: int, blocks: int, block: int, tile_vectors: int, seed: int
) -> None:
    prefill = jit.module("engine.llm.prefill_jit")
    matrix, x = _case(tokens, vectors, blocks, block, seed)
    q, scale = matrix.arrays["q"], matrix.arrays["scale"]
    assert prefill.supports(matrix.shape[0], matrix.group, matrix.activations)
    rounded = gemv.quantize_activations(x, block).astype(np.float64)
    expected = rounded @ matrix.dense().astype(np.float64).T
    original = prefill.TILE_BYTES
    prefill.TILE_BYTES = 2 * x.shape[1] * 16 * tile_vectors  # several tiles, the last one partial
    try:
        found = prefill.gemm(x, q, scale, block, matrix.group)
    finally:
        prefill.TILE_BYTES = original
    assert found.shape == expected.shape and found.dtype == np.float32
    # int32 sums are exact; only the per-block float32 scaling and adds round
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    numpy_path = gemv.gemm_int4(x, q, scale, block, matrix.group, "int8")
    np.testing.assert_allclose(found, numpy_path, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def test_prefill_takes_the_integer_path_only_where_it_applies() -> None:
    prefill = jit.module("engine.llm.prefill_jit")
    assert prefill.supports(48, 4, "int8")
    assert not prefill.supports(48, 4, "float")  # float activations: BLAS on float tiles
    assert not prefill.supports(48, 1, "int8")  # the plain layout
    assert not prefill.supports(40, 4, "int8")  # not whole vectors of 16 rows
    assert not prefill.supports(48, gemv.DOT_GROUP, "int8")  # the dot layout: dot_jit.py
    matrix, x = _case(6, 2, 3, 32, 1)
    kernels = jit.module("engine.llm.gemv_jit")
    q, scale = matrix.arrays["q"], matrix.arrays["scale"]
    np.testing.assert_array_equal(
        matrix.gemm(x), prefill.gemm(x, q, scale, 32, matrix.group)
    )  # Matrix.gemm routes row-grouped int4 with int8 activations here
    np.testing.assert_array_equal(
        kernels.gemm_int4_jit(x, q, scale, 32, matrix.group, "int8"), matrix.gemm(x)
    )


def test_two_threads_give_one_threads_bits() -> None:
    prefill = jit.module("engine.llm.prefill_jit")
    matrix, x = _case(13, 6, 3, 64, 7)
    q, scale = matrix.arrays["q"], matrix.arrays["scale"]
    serial = prefill.gemm(x, q, scale, 64, matrix.group)
    with jit.thread_limit(2):
        parallel = prefill.gemm(x, q, scale, 64, matrix.group)
    np.testing.assert_array_equal(parallel, serial)
