"""Hypothesis: the transformer JIT kernels (numba) against numpy and onnx's ReferenceEvaluator: the
vectorised 2^x (exp_jit) over its whole float32 range and edge values, and FusedAttention with
the JIT softmax (batched and per head; products by BLAS, or per head by the JIT GEMM) over
shapes, masks, views and score magnitudes.  Skipped as a whole without numba or with
FERRY_JIT=0 (the numpy kernels are tested without it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit, kernels  # noqa: E402
from engine.ops import fused  # noqa: E402
from engine.ops.fastmath import forced_forms  # noqa: E402
from tests.engine.helpers import run_reference  # noqa: E402
from tests.engine.test_transformer_kernels import _array, _attention_model, attention_cases  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

exp_jit = jit.module("engine.ops.exp_jit")
attention_jit = jit.module("engine.ops.attention_jit")
SETTINGS = settings(max_examples=40, deadline=None)
JIT_ATTENTION = (
    attention_jit.attention_jit,
    attention_jit.attention_jit_per_head,
    attention_jit.attention_gemm_per_head,
    attention_jit.attention_gemm_heads,
    attention_jit.attention_gemm_heads8,
)


# -- 2^x ----------------------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.floats(-126, 127, width=32), min_size=1, max_size=300))
@example([0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 126.9, -125.9, 1e-30, -1e-30])
def test_exp2_is_float32_rounding_of_the_true_power(values):
    x = np.array(values, np.float32)
    want = np.exp2(x.astype(np.float64))
    got = exp_jit.exp2(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=0)


def test_exp2_limits_and_special_values():
    x = np.array([np.nan, -np.inf, np.inf, -200.0, -127.6, 128.6, 300.0], np.float32)
    got = exp_jit.exp2(x)
    assert np.isnan(got[0])
    np.testing.assert_array_equal(got[1:], [0, np.inf, 0, 0, np.inf, np.inf])  # float32's own limits


@given(st.integers(1, 70), st.floats(-3, 3), st.floats(0.25, 1.5))
@settings(max_examples=20, deadline=None)
def test_exp2_row_applies_shift_and_scale_to_a_prefix(n, shift, scale):
    x = _array(n, (n + 5,), 4.0)
    out, bits = np.full(n + 5, -1.0, np.float32), np.zeros(n + 5, np.int32)
    exp_jit.exp2_row(x, np.float32(scale), np.float32(shift), out, bits, n)
    want = np.exp2((x[:n].astype(np.float64) - np.float32(shift)) * np.float32(scale))
    np.testing.assert_allclose(out[:n], want, rtol=1e-6)
    assert np.all(out[n:] == -1.0)  # only the first n written


# -- FusedAttention with the JIT softmax ----------------------------------------------------------


@SETTINGS
@given(attention_cases(), st.booleans(), st.booleans())
def test_jit_attention_matches_numpy_and_the_reference(case, k_transposed, natural_exp):
    q, k, v, mask, scale = case
    model, feeds = _attention_model(q, k, v, mask, scale)
    want = run_reference(model, feeds)[0]
    key = np.ascontiguousarray(np.swapaxes(k, -1, -2)) if k_transposed else k
    inputs = [q, key, v] + ([mask] if mask is not None else [])
    attrs = {"scale": scale, "k_transposed": int(k_transposed)}
    offered = kernels.jit_candidates("FusedAttention", attrs, [a.shape for a in inputs])
    assert attention_jit.attention_jit in offered
    assert (attention_jit.attention_jit_per_head in offered) == (mask is None)
    many = q.shape[-2] >= attention_jit.GEMM_MIN_QUERIES
    assert (attention_jit.attention_gemm_per_head in offered) == (mask is None and many)
    assert (attention_jit.attention_gemm_heads in offered) == many
    assert (attention_jit.attention_gemm_heads8 in offered) == many
    with forced_forms(natural_exp, table_gelu=False):
        numpy_result = fused.fused_attention(inputs, attrs)[0]
        for kernel in JIT_ATTENTION:
            got = kernel(inputs, attrs)[0]
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)
            np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)


@SETTINGS
@given(attention_cases())
def test_jit_attention_with_q_prescaled_by_log2e(case):
    q, k, v, mask, scale = case
    model, feeds = _attention_model(q, k, v, mask, scale)
    want = run_reference(model, feeds)[0]
    prescaled = (q.astype(np.float64) * scale * math.log2(math.e)).astype(np.float32)
    inputs = [prescaled, k, v] + ([mask] if mask is not None else [])
    for kernel in JIT_ATTENTION:
        got = kernel(inputs, {"scale": 1.0, "q_log2e": 1})[0]
        # q rounded to float32 again after its scaling moves large scores by ~1e-7 of their size
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kernel.__name__)


SHIFTS = st.lists(st.sampled_from([0.0, -40.0, -300.0, 45.0, 300.0]), min_size=1, max_size=24)


@settings(max_examples=20, deadline=None)
@given(attention_cases(), SHIFTS)
def test_jit_attention_is_shift_invariant_per_query(case, shifts):
    """Scores far above or below zero (the max shift keeps the exponentials in range)."""
    q, k, v, _, scale = case
    model, feeds = _attention_model(q, k, v, None, scale)
    want = run_reference(model, feeds)[0]
    offsets = np.resize(np.array(shifts, np.float32), q.shape[-2]) / scale
    shifted_q = np.concatenate([q, np.broadcast_to(offsets[:, None], (*q.shape[:-1], 1))], axis=-1)
    shifted_k = np.concatenate([k, np.ones((*k.shape[:-1], 1), np.float32)], axis=-1)
    for kernel in JIT_ATTENTION:
        got = kernel([shifted_q, shifted_k, v], {"scale": scale})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kernel.__name__)


def test_jit_attention_masked_keys_and_a_fully_masked_query():
    """-1e4 and -inf masks: masked keys get weight 0; a query with every key at -1e4 gets the
    reference's uniform softmax; NaN in the scores stays NaN in that query's row only."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, n, 4)).astype(np.float32) for n in (3, 5, 5))
    mask = np.zeros((3, 5), np.float32)
    mask[1] = -1e4
    mask[2, :3] = -np.inf
    model, feeds = _attention_model(q, k, v, mask, 0.5)
    want = run_reference(model, feeds)[0]
    masked = (
        attention_jit.attention_jit,
        attention_jit.attention_gemm_heads,
        attention_jit.attention_gemm_heads8,
    )
    for kernel in masked:
        got = kernel([q, k, v, mask], {"scale": 0.5})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel.__name__)
    q[0, 2, 1] = np.nan
    for kernel in masked:
        got = kernel([q, k, v], {"scale": 0.5})[0]
        assert np.all(np.isnan(got[0, 2])) and np.all(np.isfinite(np.delete(got[0], 2, axis=0)))


def test_jit_attention_writes_the_head_merged_view_and_falls_back_for_float16():
    """With views/out_view (the converter's folded head split and merge) the JIT kernels give
    the numpy kernel's result; float16 inputs take the numpy kernel."""
    rng = np.random.default_rng(9)
    batch, seq, heads, dim = 1, 7, 3, 4
    qkv = rng.standard_normal((batch, seq, 3 * heads * dim)).astype(np.float32)
    row = 3 * heads * dim

    def view(part: int) -> dict:
        return {
            "shape": [batch, heads, seq, dim],
            "offset": part * heads * dim,
            "strides": [seq * row, dim, row, 1],
        }

    attrs = fused.prepare_attention(
        {
            "scale": dim**-0.5,
            "views": [view(0), view(1), view(2)],
            "out_view": {
                "shape": [batch, seq, heads * dim],
                "view": {
                    "shape": [batch, heads, seq, dim],
                    "offset": 0,
                    "strides": [seq * heads * dim, dim, heads * dim, 1],
                },
            },
        },
        3,
        1,
    )
    want = fused.fused_attention([qkv, qkv, qkv], attrs)[0]
    for kernel in JIT_ATTENTION:
        got = kernel([qkv, qkv, qkv], attrs)[0]
        assert got.shape == (batch, seq, heads * dim)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=kernel.__name__)
    half = [a.astype(np.float16) for a in (qkv, qkv, qkv)]
    for kernel in JIT_ATTENTION:
        np.testing.assert_array_equal(kernel(half, attrs)[0], fused.fused_attention(half, attrs)[0])


def test_jit_softmax_runs_rows_in_parallel_with_two_threads():
    """The parallel variant (two threads allowed) gives the serial variant's result exactly."""
    rows = _array(3, (37, 130), 5.0)
    serial = attention_jit.softmax_rows_into(rows.copy(), 1.0)
    with jit.thread_limit(2):
        parallel = attention_jit.softmax_rows_into(rows.copy(), 1.0)
    np.testing.assert_array_equal(serial, parallel)
    np.testing.assert_allclose(serial.sum(axis=1), 1.0, rtol=1e-6)


# -- GELU (rows_jit: the polynomial form with exp_jit's 2^t) -------------------------------------


@SETTINGS
@given(st.integers(1, 9), st.integers(1, 300), st.sampled_from([0.5, 3.0, 12.0]), st.booleans())
def test_jit_gelu_rows_match_the_erf_formula_with_and_without_bias(rows, width, spread, with_bias):
    rows_jit = jit.module("engine.ops.rows_jit")
    x = _array(rows * width, (rows, width), spread)
    bias = _array(width, (width,)) if with_bias else None
    wide = x.astype(np.float64) + (0 if bias is None else bias)
    want = 0.5 * wide * (1 + np.vectorize(math.erf)(wide / math.sqrt(2)))
    got = rows_jit.gelu_rows_into(x.copy(), bias)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with jit.thread_limit(2):  # the parallel variant: the same values
        np.testing.assert_array_equal(rows_jit.gelu_rows_into(x.copy(), bias), got)


def test_jit_gelu_limits():
    rows_jit = jit.module("engine.ops.rows_jit")
    x = np.array([[np.inf, -np.inf, np.nan, -40.0, 40.0, -6.5, 0.0, -0.0]], np.float32)
    got = rows_jit.gelu_rows_into(x.copy(), None)[0]
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2])  # gelu(-inf) is NaN, as erf's
    assert got[3] == 0 and got[4] == 40.0 and abs(got[5]) < 1e-9 and got[6] == 0 and got[7] == 0
