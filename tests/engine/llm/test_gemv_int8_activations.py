"""int4 matrices that multiply int8-rounded activations (llama.cpp's q4_0 x q8_0): the rounding,
the int16 kernel's exactness at the extremes of its range, and the package round trip."""

from __future__ import annotations

import numpy as np
import pytest

from engine import jit
from engine.llm import gemv
from engine.llm.weights import gemv_kernel, make_matrix


@pytest.mark.parametrize("block", [32, 64])
def test_activations_round_to_127_steps_of_their_blocks_largest_magnitude(block: int) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4 * block)).astype(np.float32)
    x[1, :block] = 0.0  # an all-zero block stays zero (no division by zero)
    rounded = gemv.quantize_activations(x, block)
    step = np.abs(x).reshape(3, 4, block).max(axis=2) / 127
    levels = rounded.reshape(3, 4, block) / np.where(step > 0, step, 1)[..., None]
    np.testing.assert_allclose(levels, np.rint(levels), atol=1e-3)  # whole multiples of the step
    assert np.abs(levels).max() <= 127 + 1e-3
    error = np.abs(rounded - x).reshape(3, 4, block)
    assert np.all(error <= step[..., None] / 2 + 1e-6)
    assert np.all(rounded[1, :block] == 0)


@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_int16_kernel_is_exact_at_the_largest_sums(block: int, sign: float) -> None:
    """Every weight at -8 steps and every x at its block's largest magnitude: each int16
    accumulator holds 32 * 8 * 127 = 32512, the most it ever holds."""
    rows, k = 8, 4 * block
    w = np.full((rows, k), -1.0, np.float32)  # q = -8 everywhere (the block's extreme)
    x = np.full(k, sign, np.float32)
    matrix = make_matrix(w, "int4", block, 4, "int8")
    expected = matrix.dense().astype(np.float64) @ x
    np.testing.assert_allclose(expected, -sign * k, rtol=1e-6)
    out = gemv_kernel("LlmGemvInt4")(
        [x, matrix.arrays["q"], matrix.arrays["scale"]], {"block": block, "group": 4, "activations": "int8"}
    )[0]
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    w[:, ::2] = 7 / 8  # q = +7 beside -8: the other extreme of the nibbles
    x[1::2] = -sign
    matrix = make_matrix(w, "int4", block, 4, "int8")
    expected = matrix.dense().astype(np.float64) @ x
    out = matrix.gemv(x)
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    assert jit.enabled() is False or gemv_kernel("LlmGemvInt4").jit  # the int16 kernel ran


def test_int8_activations_cost_little_beside_int4_weights() -> None:
    """The rounding of x adds far less error than the int4 weights themselves (random data)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((512, 576)).astype(np.float32)
    x = rng.standard_normal(576).astype(np.float32)
    exact = w.astype(np.float64) @ x
    weights_only = make_matrix(w, "int4", 32).gemv(x)
    both = make_matrix(w, "int4", 32, None, "int8").gemv(x)
    weight_error = np.sqrt(np.mean((weights_only - exact) ** 2))
    added = np.sqrt(np.mean((both - weights_only) ** 2))
    assert added < weight_error / 4


def test_activations_are_refused_on_other_kinds_and_unknown_names() -> None:
    matrix = make_matrix(np.ones((4, 64), np.float32), "fp32")
    matrix.activations = "int8"
    with pytest.raises(ValueError, match="activations 'int8' apply to int4 and int8 only"):
        matrix.check("m", (4, 64))
    # int8 takes int8 activations only in the dot layout (16 rows dividing N): not these bytes
    matrix = make_matrix(np.ones((4, 64), np.float32), "int8")
    matrix.activations = "int8"
    with pytest.raises(ValueError, match="activations 'int8' cannot hold"):
        matrix.check("m", (4, 64))
    matrix = make_matrix(np.ones((4, 64), np.float32), "int4", 32, None, "int4")
    with pytest.raises(ValueError, match="activations 'int4' cannot hold"):
        matrix.check("m", (4, 64))


def test_float16_scales_are_read_exactly_normal_subnormal_and_zero() -> None:
    """The int16 kernel widens float16 scales by their bits: normal, subnormal (weights ~1e-6)
    and zero (an all-zero block) scales all give the dequantized matrix's product."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 128)).astype(np.float32)
    w[4:8] *= 1e-6  # block scales ~1e-7: float16 subnormals
    w[8:12, :32] = 0.0  # a zero scale
    w[12:] *= -3e3  # large scales, both signs
    matrix = make_matrix(w, "int4", 32, 4, "int8")
    assert matrix.arrays["scale"].dtype == np.float16
    scales = np.abs(matrix.arrays["scale"][4:8].astype(np.float32))
    assert np.all(scales < np.finfo(np.float16).tiny) and np.all(scales > 0)
    x = rng.standard_normal(128).astype(np.float32)
    expected = matrix.dense().astype(np.float64) @ gemv.quantize_activations(x[None, :], 32)[0]
    out = matrix.gemv(x)
    np.testing.assert_allclose(out[4:8], expected[4:8], rtol=1e-4)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
