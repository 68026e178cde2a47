"""The int4 dot layout (gemv.py) and its kernels (engine/llm/dot_jit.py): the layout holds the
same values, and the GEMV and GEMM give the float64 products of the same rounded activations
and dequantized weights (their int32 sums are exact: only the per-block float scaling rounds)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.llm.convert import _int8_activations
from engine import jit
from engine.llm import gemv
from engine.llm.model import LlmWeights
from engine.llm.weights import gemv_kernel, make_matrix

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
DOT = gemv.DOT_GROUP


def _matrix(n: int, k: int, block: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 3.0, (n, 1)).astype(np.float32)
    return make_matrix(w, "int4", block, activations="int8"), rng


@pytest.mark.parametrize("block", [32, 64])
def test_the_dot_layout_holds_the_plain_layouts_bytes_and_scales(block: int) -> None:
    w = np.random.default_rng(1).standard_normal((48, 4 * block)).astype(np.float32)
    plain, scale = gemv.quantize_int4(w, block, half_scales=True)
    dot, dot_scale = gemv.quantize_int4(w, block, DOT, half_scales=True)
    assert dot.shape == plain.shape and not np.array_equal(dot, plain)
    assert dot_scale.shape == scale.shape and not np.array_equal(dot_scale, scale)
    np.testing.assert_array_equal(gemv.to_standard(dot, block, DOT), plain)
    np.testing.assert_array_equal(gemv.standard_scales(dot_scale, DOT), scale)
    # byte 4c + t of row 16v + g's block b sits at [v, b, c, g, t]
    view = dot.reshape(3, 4, block // 8, 16, 4)
    assert view[2, 1, 3, 5, 2] == plain[37, block // 2 + 14]
    assert dot_scale.reshape(3, 4, 16)[1, 3, 9] == scale[25, 3]
    index = np.array([47, 0, 16, 16, 5])
    np.testing.assert_array_equal(gemv.grouped_rows(dot, index, block, DOT), plain[index])
    np.testing.assert_array_equal(gemv.grouped_scale_rows(dot_scale, index, DOT), scale[index])
    matrix = make_matrix(w, "int4", block, activations="int8")
    assert matrix.group == DOT
    matrix.check("m", (48, 4 * block))
    np.testing.assert_array_equal(
        matrix.dense(), gemv.dequantize_int4(plain, scale.astype(np.float32), block)
    )
    # float activations, or rows 16 does not divide, keep the row groups
    assert make_matrix(w, "int4", block).group == 4
    assert make_matrix(w[:40], "int4", block, activations="int8").group in (4, 8)


def test_the_converter_regroups_its_int4_matrices_into_the_dot_layout() -> None:
    rng = np.random.default_rng(2)
    head = make_matrix(rng.standard_normal((64, 96)).astype(np.float32), "int4", 32)
    odd = make_matrix(rng.standard_normal((24, 96)).astype(np.float32), "int4", 32)
    before = head.dense(), odd.dense()
    # an untied embedding whose rows 16 does not divide beside a head whose rows it does
    weights = LlmWeights(embed=odd, lm_head=head, norm=np.ones(96, np.float32), layers=[])
    _int8_activations(weights)
    assert (head.group, head.activations, head.arrays["scale"].dtype) == (DOT, "int8", np.float16)
    assert odd.group == 4 and odd.activations == "int8"
    for matrix, dense in zip((head, odd), before, strict=True):  # only the scales' float16 rounding
        np.testing.assert_allclose(matrix.dense(), dense, rtol=1e-3, atol=1e-6)


@needs_jit
@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 9),
    vectors=st.integers(1, 4),
    blocks=st.integers(1, 4),
    block=st.sampled_from([32, 64]),
    seed=st.integers(0, 2**16),
)
def test_the_gemv_and_gemm_give_the_products_of_the_rounded_values(
    tokens: int, vectors: int, blocks: int, block: int, seed: int
) -> None:
    matrix, rng = _matrix(16 * vectors, blocks * block, block, seed)
    x = rng.standard_normal((tokens, blocks * block)).astype(np.float32)
    x *= rng.uniform(0.1, 10.0, (tokens, 1)).astype(np.float32)
    x[0, :block] = 0.0  # a block of zeros: d_x = 0
    rounded = gemv.quantize_activations(x, block).astype(np.float64)
    expected = rounded @ matrix.dense().astype(np.float64).T
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * np.abs(expected).max()}
    found = matrix.gemm(x)  # dot_jit.gemm
    assert found.shape == expected.shape and found.dtype == np.float32
    np.testing.assert_allclose(found, expected, **tolerance)
    for t in range(tokens):  # dot_jit.gemv_dot, through the kernel layer
        np.testing.assert_allclose(matrix.gemv(x[t]), expected[t], **tolerance)
    numpy_path = gemv.gemm_int4(x, matrix.arrays["q"], matrix.arrays["scale"], block, DOT, "int8")
    np.testing.assert_allclose(found, numpy_path, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@needs_jit
@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_dot_products_are_exact_at_the_extremes_of_both_nibbles(block: int, sign: float) -> None:
    """Every weight at -8 steps or +7, every x at its block's largest magnitude: the largest
    sums the int32 lanes and the 16x high-nibble sums ever hold, both signs."""
    rows, k = 32, 4 * block
    w = np.full((rows, k), -1.0, np.float32)  # q = -8 everywhere
    w[::2, 1::2] = 7 / 8  # q = +7 beside -8 on every other row
    x = np.full(k, sign, np.float32)
    x[k // 2 :: 3] = -sign
    matrix = make_matrix(w, "int4", block, activations="int8")
    assert matrix.group == DOT
    expected = matrix.dense().astype(np.float64) @ x
    np.testing.assert_allclose(gemv_kernel("LlmGemvInt4")([x, matrix.arrays["q"], matrix.arrays["scale"]], {
        "block": block, "group": DOT, "activations": "int8"})[0], expected, rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(matrix.gemm(np.stack([x, -x])), np.stack([expected, -expected]), rtol=1e-6)


@needs_jit
def test_two_threads_give_one_threads_bits() -> None:
    matrix, rng = _matrix(96, 192, 64, 7)
    x = rng.standard_normal((13, 192)).astype(np.float32)
    serial = matrix.gemm(x)
    with jit.thread_limit(2):
        parallel = matrix.gemm(x)
    np.testing.assert_array_equal(parallel, serial)
