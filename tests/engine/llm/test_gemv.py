"""The int8/int4 layouts and their kernels: numpy and JIT agree with the dequantized matrix."""

from __future__ import annotations

import numpy as np
import pytest

from engine import jit, kernels
from engine.llm import gemv
from engine.llm.weights import make_matrix


@pytest.mark.parametrize("block", [32, 64])
def test_int4_round_trip_is_within_a_step_and_uses_all_sixteen_levels(block: int) -> None:
    w = np.random.default_rng(1).standard_normal((37, 128)).astype(np.float32)
    packed, scale = gemv.quantize_int4(w, block)
    assert packed.shape == (37, 64) and packed.dtype == np.uint8 and scale.shape == (37, 128 // block)
    back = gemv.dequantize_int4(packed, scale, block)
    step = np.repeat(np.abs(scale), block, axis=1)
    error = np.abs(back - w)
    # half a step, except the values clipped at +7 whose block's extreme is negative (q4_0's rule)
    assert np.all(error <= step + 1e-6)
    assert np.mean(error <= step / 2 + 1e-6) > 0.97
    nibbles = np.concatenate([packed & 15, packed >> 4])
    assert set(np.unique(nibbles)) == set(range(16))
    # the block's largest magnitude is exact (q4_0's rule: it maps to -8)
    assert np.allclose(np.abs(back).max(axis=1), np.abs(w).max(axis=1), rtol=1e-6)


def test_int4_needs_a_block_that_divides_the_rows() -> None:
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        gemv.quantize_int4(np.zeros((2, 40), np.float32), 32)
    assert make_matrix(np.ones((2, 40), np.float32), "int4", 32).kind == "int8"


def test_the_row_grouped_int4_layout_holds_the_same_values() -> None:
    w = np.random.default_rng(3).standard_normal((12, 128)).astype(np.float32)
    plain, scale = gemv.quantize_int4(w, 32)
    grouped, same_scale = gemv.quantize_int4(w, 32, group=4)
    assert grouped.shape == plain.shape and not np.array_equal(grouped, plain)
    np.testing.assert_array_equal(same_scale, scale)
    np.testing.assert_array_equal(gemv.to_standard(grouped, 32, 4), plain)
    np.testing.assert_array_equal(gemv.to_grouped(plain, 32, 4), grouped)
    index = np.array([11, 0, 5, 5, 6])
    np.testing.assert_array_equal(gemv.grouped_rows(grouped, index, 32, 4), plain[index])
    matrix = make_matrix(w, "int4", 32)
    assert matrix.group == 4 and make_matrix(w[:10], "int4", 32).group == 1  # 4 does not divide 10
    np.testing.assert_array_equal(matrix.rows(index), gemv.dequantize_int4(plain, scale, 32)[index])


@pytest.mark.parametrize(
    ("kind", "group", "activations"),
    [
        ("int8", None, "float"),
        ("int4", 1, "float"),
        ("int4", 4, "float"),
        ("int4", 1, "int8"),
        ("int4", 4, "int8"),
        ("int4", gemv.DOT_GROUP, "int8"),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_every_gemv_candidate_matches_the_dequantized_matrix(
    kind: str, group: int | None, activations: str, threads: int
) -> None:
    """With int8 activations every path multiplies the same rounded x: only float rounding differs."""
    rng = np.random.default_rng(2)
    matrix = make_matrix(rng.standard_normal((304, 192)).astype(np.float32), kind, 64, group, activations)
    x = rng.standard_normal(192).astype(np.float32)
    seen = gemv.quantize_activations(x[None, :], 64)[0] if activations == "int8" else x
    expected = matrix.dense().astype(np.float64) @ seen
    op = "LlmGemvInt4" if kind == "int4" else "LlmGemvInt8"
    jit.load(ops=[op])
    found = kernels.candidates(op, {}, [])
    assert kernels.tier(found[0]) == "numpy"
    assert len(found) == (2 if jit.enabled() else 1)
    for kernel in found:
        with jit.thread_limit(threads):
            attrs = {"block": 64, "group": matrix.group, "activations": activations}
            out = kernel([x, matrix.arrays["q"], matrix.arrays["scale"]], attrs)[0]
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        matrix.gemm(np.stack([x, x])), np.stack([expected, expected]), rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(matrix.gemv(x), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("total", [1, 7, 50])
def test_every_decode_attention_candidate_matches_the_softmax_of_the_equations(total: int) -> None:
    rng = np.random.default_rng(4)
    heads, kv, d, context = 6, 2, 16, 64
    q = rng.standard_normal((heads, d)).astype(np.float32)
    keys = rng.standard_normal((kv, context, d)).astype(np.float32)
    values = rng.standard_normal((kv, context, d)).astype(np.float32)
    keys[:, total:] = values[:, total:] = np.nan  # positions past ``total`` must not be read
    expected = []
    for h in range(heads):
        g = h // (heads // kv)
        s = keys[g, :total].astype(np.float64) @ q[h] / 4.0
        e = np.exp(s - s.max())
        expected.append(e / e.sum() @ values[g, :total])
    jit.load(ops=["LlmDecodeAttention"])
    found = kernels.candidates("LlmDecodeAttention", {}, [])
    assert len(found) == (2 if jit.enabled() else 1)
    for kernel in found:
        out = kernel([q, keys, values], {"total": total, "scale": 0.25})[0]
        np.testing.assert_allclose(out, np.concatenate(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
@pytest.mark.parametrize("activations", ["float", "int8"])
@pytest.mark.parametrize(("n", "k", "block"), [(12, 64, 32), (40, 128, 64), (8, 96, 32)])
def test_prefills_jit_tiles_give_numpys_products_bit_for_bit(
    n: int, k: int, block: int, activations: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = jit.module("engine.llm.gemv_jit")
    rng = np.random.default_rng(n + k)
    matrix = make_matrix(
        rng.standard_normal((n, k)).astype(np.float32), "int4", block, activations=activations
    )
    x = rng.standard_normal((5, k)).astype(np.float32)
    q, scale = matrix.arrays["q"], matrix.arrays["scale"]
    expected = gemv.gemm_int4(x, q, scale, block, matrix.group, activations)
    monkeypatch.setattr(gemv, "TILE_BYTES", 4 * k * 8)  # several tiles, the last one partial for n=12/40
    found = kernels.gemm_int4_jit(x, q, scale, block, matrix.group, activations)
    np.testing.assert_array_equal(found, expected)
    np.testing.assert_array_equal(matrix.gemm(x), expected)


@pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
@pytest.mark.parametrize("block", [32, 64])
def test_prefills_jit_rounding_of_activations_is_numpys_bit_for_bit(block: int) -> None:
    kernels = jit.module("engine.llm.gemv_jit")
    x = np.random.default_rng(block).standard_normal((6, 4 * block)).astype(np.float32)
    x[1, :block] = 0.0  # a block of zeros: d = 0, every value 0
    x[2, block : 2 * block] *= 1e-30  # tiny magnitudes
    x[3, 5] = -1e30
    found = np.empty_like(x)
    kernels._round_activations(x, block, found)
    np.testing.assert_array_equal(found, gemv.quantize_activations(x, block))


def test_the_row_group_gives_the_gemv_at_least_128_lanes_where_it_can() -> None:
    assert gemv.choose_group(960, 576, 32) == 8  # SmolLM2's K = 576: 4 x 18 = 72 lanes are too few
    assert gemv.choose_group(576, 1536, 32) == 4  # K = 1536: 4 x 48 = 192
    assert gemv.choose_group(1152, 896, 32) == 8  # Qwen2.5-0.5B's K = 896: 8 x 28 = 224
    assert gemv.choose_group(12, 576, 32) == 4  # 8 does not divide 12
    assert gemv.choose_group(16, 64, 32) == 4  # no group reaches 128 lanes: 4 as before
    assert gemv.choose_group(10, 64, 32) == 1
    matrix = make_matrix(np.ones((16, 576), np.float32), "int4", 32)
    assert matrix.group == 8
    matrix.check("m", (16, 576))


@pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
@pytest.mark.parametrize("group", [4, 8])
def test_the_int16_gemv_reads_any_group_from_the_shapes(group: int) -> None:
    rng = np.random.default_rng(group)
    matrix = make_matrix(rng.standard_normal((48, 576)).astype(np.float32), "int4", 32, group, "int8")
    matrix.arrays["scale"] = matrix.arrays["scale"].astype(np.float16)
    x = rng.standard_normal(576).astype(np.float32)
    expected = matrix.dense().astype(np.float64) @ gemv.quantize_activations(x[None, :], 32)[0]
    kernels = jit.module("engine.llm.gemv_jit")
    lanes = group * 576 // 32
    packed = np.asarray(matrix.arrays["q"]).reshape(48 // group, 16, lanes)
    halves = matrix.arrays["scale"].view(np.uint16).reshape(48 // group, lanes)
    out = np.empty(48, np.float32)
    kernels._int4_grouped_q8(x, packed, halves, 32, 4, out)  # 4: a layer's shared argument
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
def test_the_jit_exp_is_within_2_ulp_of_the_exact_one_and_tiny_below_its_range() -> None:
    """attention_jit's exp (softmaxes, SwiGLU), over its whole float32 range and past it."""
    import numba  # noqa: PLC0415

    exp = jit.module("engine.llm.attention_jit").exp

    @numba.njit
    def apply(x: np.ndarray, out: np.ndarray) -> None:
        for i in range(x.size):
            out[i] = exp(x[i])

    x = np.concatenate([np.linspace(-87, 88, 400_001), [0.0, -1e-8, 1e-8, -100.0, -1e30]]).astype(np.float32)
    out = np.empty_like(x)
    apply(x, out)
    exact = np.exp(x.astype(np.float64))
    inside = x >= -87
    assert np.all(np.abs(out[inside] - exact[inside]) <= 2 * 2**-24 * exact[inside])
    assert out[x == 0][0] == 1.0
    assert np.all((out[~inside] >= 0) & (out[~inside] < 2e-38))
