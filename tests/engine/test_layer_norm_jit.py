"""Hypothesis: the JIT LayerNormalization (engine/ops/rows_jit.py) against onnx's ReferenceEvaluator
and the numpy kernel, over shapes, epsilons, rows far from zero, with and without bias, with the
Mean / InvStdDev outputs; and the kernel search offering it once numba is loaded.  Skipped
without numba or with FERRY_JIT=0 (the numpy kernel is tested without it)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from engine import jit, kernels  # noqa: E402
from engine.ops.normalization import layer_normalization, pack_layer_norm  # noqa: E402
from tests.engine.helpers import assert_same, run_reference, single_node_model  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

rows_jit = jit.module("engine.ops.rows_jit")
SETTINGS = settings(max_examples=40, deadline=None)


def _tolerances(x: np.ndarray, scale: np.ndarray) -> tuple[float, float]:
    """Rows far from zero lose digits to cancellation in any float32 LayerNorm (the reference's
    included): allow for it as test_decode_paths does."""
    inv_std = 1 / np.sqrt(x.astype(np.float64).var(axis=-1) + 1e-5)
    conditioning = np.max(np.abs(x)) * np.max(inv_std) * np.max(np.abs(scale))
    return 1e-5, 1e-5 + 16 * np.finfo(np.float32).eps * conditioning


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(1, 7), min_size=0, max_size=2),
    st.integers(1, 400),
    st.booleans(),
    st.sampled_from([1, 3]),
    st.sampled_from([0.0, 5.0, 300.0]),
    st.sampled_from([1e-5, 1e-12, 0.1]),
)
def test_jit_layer_norm_matches_the_reference_and_numpy(seed, lead, width, with_bias, n_outputs, offset, eps):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*lead, width)) * 2 + offset).astype(np.float32)
    scale = rng.standard_normal(width).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32) if with_bias else None
    inputs = [x, scale] + ([bias] if with_bias else [])
    attrs = {"axis": -1, "epsilon": eps}
    model, feeds = single_node_model("LayerNormalization", inputs, attrs, n_outputs=n_outputs)
    want = run_reference(model, feeds)
    rtol, atol = _tolerances(x, scale)
    got = rows_jit.layer_norm_jit(inputs, attrs)
    assert [a.dtype for a in got] == [np.float32] * 3 and got[0].shape == x.shape
    assert_same(got[:n_outputs], want, rtol=rtol, atol=atol)
    assert_same(got, layer_normalization(inputs, attrs), rtol=rtol, atol=atol)


def test_jit_layer_norm_packed_uniform_scale_constant_rows_and_fallbacks():
    x = np.full((3, 8), 7.0, np.float32)  # zero variance: just the bias
    scale, bias = np.full(8, 2.0, np.float32), np.arange(8, dtype=np.float32)
    packed = pack_layer_norm([x, scale, bias], {})
    assert packed[1].strides == (0,)  # the stride-0 form the numpy kernel's pack makes
    (y, mean, inv_std) = rows_jit.layer_norm_jit([x, packed[1], bias], {})
    np.testing.assert_array_equal(y, np.broadcast_to(bias, x.shape))
    assert mean.shape == inv_std.shape == (3, 1) and np.all(mean == 7.0)
    # not over the last axis, or float64: the numpy kernel's result exactly
    wide = np.random.default_rng(1).standard_normal((2, 4, 5))
    for inputs, attrs in (
        ([wide.astype(np.float32), np.ones((4, 5), np.float32)], {"axis": 1}),
        ([wide, np.ones(5), np.zeros(5)], {}),
    ):
        for a, b in zip(
            rows_jit.layer_norm_jit(inputs, attrs), layer_normalization(inputs, attrs), strict=True
        ):
            np.testing.assert_array_equal(a, b)


def test_jit_layer_norm_is_a_candidate_once_numba_is_loaded():
    found = kernels.candidates("LayerNormalization", {}, [(197, 192), (192,), (192,)])
    assert found[0] is layer_normalization and rows_jit.layer_norm_jit in found
    assert kernels.tier(rows_jit.layer_norm_jit) == "jit"
