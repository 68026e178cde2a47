"""Conv: im2col + matmul in general, a direct matmul for 1x1 kernels, tap sums for depthwise.

The planner picks the variant once per input-shape signature (``select_conv``); every
variant checks its own precondition and falls back to im2col, so a stale choice is only
slower, never wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.registry import Kernel, register, selector

# im2col materialises C*K*P values per image; above this many bytes the batch is split.
COLUMN_BUDGET_BYTES = 64 * 1024 * 1024


def _prepare(
    inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, window.Window]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    group = int(attrs.get("group", 1))
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"Conv needs X and W of the same rank >= 3, got X{x.shape} W{w.shape}")
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(f"X{x.shape} and W{w.shape} do not agree with group={group}")
    kernel = tuple(w.shape[2:])
    if attrs.get("kernel_shape") and tuple(attrs["kernel_shape"]) != kernel:
        raise ValueError(f"kernel_shape {attrs['kernel_shape']} does not match W{w.shape}")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"bias B{b.shape} must have shape ({w.shape[0]},)")
    return x, w, b, group, window.geometry(attrs, tuple(x.shape[2:]), kernel)


def _finish(y: np.ndarray, b: np.ndarray | None, win: window.Window, dtype: np.dtype) -> np.ndarray:
    """(N, M, P) or (N, g, M/g, P) -> (N, M, *out), plus bias."""
    y = y.reshape(y.shape[0], -1, *win.out)
    if b is not None:
        y += b.reshape(1, -1, *([1] * len(win.out)))
    return y.astype(dtype, copy=False)


@register("Conv")
def conv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    shapes = [None if v is None else v.shape for v in inputs]
    return select_conv(attrs, shapes)(inputs, attrs)


@selector("Conv")
def select_conv(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> Kernel:
    x_shape, w_shape = shapes[0], shapes[1]
    if x_shape is None or w_shape is None or len(w_shape) < 3:
        return conv_im2col
    group = int(attrs.get("group", 1))
    if all(k == 1 for k in w_shape[2:]):
        return conv_1x1
    if group > 1 and group == x_shape[1] and w_shape[1] == 1:
        return conv_depthwise
    return conv_im2col


def conv_im2col(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    n, c = x.shape[:2]
    m, k, p = w.shape[0], math.prod(win.kernel), math.prod(win.out)
    xp = window.pad(x, win)
    wmat = w.reshape(group, m // group, (c // group) * k)
    dtype = np.result_type(x, w)
    y = np.empty((n, group, m // group, p), dtype=dtype)
    per_image = c * k * p * dtype.itemsize
    chunk = max(1, COLUMN_BUDGET_BYTES // max(per_image, 1))
    for start in range(0, n, chunk):
        part = xp[start : start + chunk]
        cols = np.stack([part[(slice(None), slice(None), *sl)] for _, sl in window.taps(win)], axis=2)
        cols = cols.reshape(part.shape[0], group, (c // group) * k, p)
        np.matmul(wmat, cols, out=y[start : start + chunk])
    return [_finish(y, b, win, x.dtype)]


def conv_1x1(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    if any(k != 1 for k in win.kernel):
        return conv_im2col(inputs, attrs)
    n, c = x.shape[:2]
    m = w.shape[0]
    _, sl = next(window.taps(win))
    xs = window.pad(x, win)[(slice(None), slice(None), *sl)]
    xs = xs.reshape(n, group, c // group, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, c // group), xs)
    return [_finish(y, b, win, x.dtype)]


def conv_depthwise(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    n, c = x.shape[:2]
    if group != c or w.shape[1] != 1:
        return conv_im2col(inputs, attrs)
    mult = w.shape[0] // c
    xp = window.pad(x, win)
    wk = w.reshape(c, mult, *win.kernel)
    ones = [1] * len(win.out)
    y = np.zeros((n, c, mult, *win.out), dtype=np.result_type(x, w))
    for index, sl in window.taps(win):
        patch = xp[(slice(None), slice(None), *sl)]
        y += patch[:, :, None] * wk[(slice(None), slice(None), *index)].reshape(1, c, mult, *ones)
    return [_finish(y, b, win, x.dtype)]
