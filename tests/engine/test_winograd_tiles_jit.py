"""Winograd's JIT tile transforms against winograd.py's numpy transforms, on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from engine import jit  # noqa: E402
from engine.ops import window  # noqa: E402
from engine.ops.conv import winograd  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

jit.module("engine.ops.conv.winograd_jit")  # compiles (or loads) its transforms with it
from engine.ops.conv import winograd_tiles_jit as tiles  # noqa: E402

MATRICES = {4: (winograd._WINO4_BT, winograd._WINO4_AT), 2: (winograd._WINO_BT, winograd._WINO_AT)}


def _geometry(step: int, height: int, width: int) -> tuple[window.Window, int, int]:
    win = window.geometry({"pads": [1, 1, 1, 1]}, (height, width), (3, 3))
    return win, -(-win.out[0] // step), -(-win.out[1] // step)


# channels: under one 16-lane vector, exactly one, and vectors plus a one-lane tail; the large
# case has enough values for the parallel pass (MIN_PARALLEL_VALUES)
CASES = [(4, 5, 9, 7), (4, 16, 13, 10), (2, 37, 6, 11), (2, 3, 5, 5), (4, 64, 56, 56), (2, 48, 30, 30)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("step", "c", "height", "width"), CASES)
def test_input_transform_matches_numpy(step, c, height, width, threads):
    bt = MATRICES[step][0].astype(np.float32)
    x = np.random.default_rng(c).standard_normal((c, height, width)).astype(np.float32)
    win, th, tw = _geometry(step, height, width)
    want = winograd._wino_input(x, win, th, tw, bt, step).copy()
    padded = winograd._padded_image(x, win, step * th + 2, step * tw + 2, np.dtype(np.float32)).copy()
    got = np.full(want.shape, np.nan, np.float32)
    with jit.thread_limit(threads):
        tiles.transform_input(padded, got, step, th, tw)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("step", "m", "height", "width"), CASES)
@pytest.mark.parametrize("finish", ["plain", "residual", "clip", "both"])
def test_output_transform_matches_numpy(step, m, height, width, threads, finish):
    at = MATRICES[step][1].astype(np.float32)
    size = at.shape[1]
    rng = np.random.default_rng(m + height)
    win, th, tw = _geometry(step, height, width)
    ho, wo = win.out
    prod = rng.standard_normal((size * size, th * tw, m)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    residual = rng.standard_normal((ho, wo, m)).astype(np.float32) if finish in ("residual", "both") else None
    bounds = (-0.5, 0.75) if finish in ("clip", "both") else None
    image = np.empty((step * th, step * tw, m), np.float32)
    winograd._wino_output(prod.copy(), th, tw, at, bias, image)
    want = image[:ho, :wo] + (0 if residual is None else residual)
    if bounds is not None:
        want = np.clip(want, *bounds)
    got = np.full((ho, wo, m), np.nan, np.float32)  # every pixel must be written
    with jit.thread_limit(threads):
        tiles.transform_output(prod, got, bias, residual, bounds, step, th, tw)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * max(1.0, float(np.abs(want).max())))


def test_output_transform_keeps_nan_through_the_clip():
    prod = np.zeros((36, 1, 16), np.float32)
    prod[0, 0, 3] = np.nan  # slot (0, 0) reaches output pixel (0, 0) only through A^T's first row
    got = np.zeros((4, 4, 16), np.float32)
    tiles.transform_output(prod, got, np.zeros(16, np.float32), None, (0.0, 6.0), 4, 1, 1)
    assert np.isnan(got[0, 0, 3]) and not np.isnan(got[0, 0, 2])
