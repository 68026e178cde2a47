"""The UNet's long, narrow-headed attention kernel (engine/diffusion/attention_jit.py) against
the batched numpy FusedAttention, serial and parallel, with the layouts the converter writes."""

from __future__ import annotations

import numpy as np
import pytest

from engine import jit as jit_tier

pytestmark = pytest.mark.skipif(not jit_tier.enabled(), reason="numba is not installed (or FERRY_JIT=0)")
RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def kernels():
    from engine.ops import fused  # noqa: PLC0415

    return jit_tier.module("engine.diffusion.attention_jit"), fused


def heads(batch: int, tokens: int, count: int, width: int, scale: float = 2.0) -> np.ndarray:
    """[B, tokens, heads * width] as torch lays it out, split into heads: [B, heads, tokens, width]."""
    return (
        (RNG.standard_normal((batch, tokens, count, width)) * scale).astype(np.float32).transpose(0, 2, 1, 3)
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("batch", "queries", "count", "width", "keys"),
    # widths 8, 16 and 40 take the unrolled score loops, 5 the general one
    [(2, 1024, 8, 8, 1024), (1, 300, 2, 5, 77), (2, 70, 3, 16, 33), (1, 5, 1, 8, 9), (1, 100, 2, 40, 70)],
)
def test_matches_the_numpy_kernel(kernels, threads, batch, queries, count, width, keys):
    flash, fused = kernels
    q, k, v = (
        heads(batch, queries, count, width),
        heads(batch, keys, count, width),
        heads(batch, keys, count, width),
    )
    k = np.swapaxes(k, -1, -2)  # torch hands attention k^T: the converter's k_transposed
    attrs = {"k_transposed": 1, "scale": width**-0.5}
    want = fused.fused_attention([q, k, v], attrs)[0]
    with jit_tier.thread_limit(threads):
        got = flash.flash_attention([q, k, v], attrs)[0]
    assert got.shape == want.shape == (batch, count, queries, width)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_large_scores_and_broadcast_heads(kernels):
    flash, fused = kernels
    q = heads(2, 130, 4, 8, scale=12.0)  # scores in the hundreds: the max shift keeps 2^x finite
    k = heads(1, 40, 4, 8, scale=12.0)  # one batch of keys and values for both queries' batches
    v = heads(1, 40, 4, 8)
    attrs = {"scale": 8**-0.5}
    want = fused.fused_attention([q, k, v], attrs)[0]
    got = flash.flash_attention([q, k, v], attrs)[0]
    assert np.isfinite(got).all()
    # float32 scores of ~400 carry ~4e-5 of rounding, which the softmax turns into ~1e-4 relative
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_a_mask_or_float64_falls_back_to_the_numpy_kernel(kernels):
    flash, fused = kernels
    q, k, v = heads(1, 20, 2, 8), heads(1, 20, 2, 8), heads(1, 20, 2, 8)
    mask = np.triu(np.full((20, 20), -1e4, np.float32), 1)
    attrs = {"scale": 0.3}
    np.testing.assert_array_equal(
        flash.flash_attention([q, k, v, mask], attrs)[0], fused.fused_attention([q, k, v, mask], attrs)[0]
    )
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    got = flash.flash_attention([q64, k64, v64], attrs)[0]
    assert got.dtype == np.float64


def test_offered_only_for_long_unmasked_narrow_heads(kernels):
    flash, _ = kernels
    offer = flash.CANDIDATES["FusedAttention"]
    assert offer({}, [(2, 8, 1024, 8), (2, 8, 1024, 8), (2, 8, 1024, 8)]) == [flash.flash_attention]
    assert offer({}, [(2, 8, 77, 8), (2, 8, 77, 8), (2, 8, 77, 8)]) == []  # short: BLAS wins
    assert offer({}, [(2, 8, 1024, 128), (2, 8, 1024, 128), (2, 8, 1024, 128)]) == []  # wide heads
    assert offer({}, [(2, 8, 1024, 8), (2, 8, 1024, 8), (2, 8, 1024, 8), (1, 1, 1024, 1024)]) == []  # masked


def test_offered_by_the_views_shape_as_json_or_as_the_load_prepared_them(kernels):
    flash, fused = kernels
    offer = flash.CANDIDATES["FusedAttention"]
    flat = (1, 1024, 3 * 8 * 8)  # a fused qkv projection's output, heads read through views
    view = {"shape": [1, 8, 1024, 8], "offset": 0, "strides": [0, 8, 3 * 8 * 8, 1]}
    attrs = {"views": [view, {**view, "offset": 64}, {**view, "offset": 128}]}
    prepared = fused.prepare_attention(attrs, 3, 1)
    assert isinstance(prepared["views"][0], fused.ViewLayout)
    for spec in (attrs, prepared):
        assert offer(spec, [flat, flat, flat]) == [flash.flash_attention]
