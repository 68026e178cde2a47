"""Conv as one GEMM over the input itself: 1x1 convs (NCHW or channels last, the bias as a GEMM
column) and patch convs whose windows tile the image (kernel == stride)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv.common import (
    PING,
    _channels_last_view,
    _epilogue,
    _finish,
    _prepare,
    residual_of,
)
from engine.ops.conv.im2col import conv_im2col
from engine.ops.scratch import scratch


def conv_1x1(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    if any(k != 1 for k in win.kernel):
        return conv_im2col(inputs, attrs)
    if _pointwise_channels_last(x, w.shape[0], group, win):
        return [_conv_1x1_channels_last(x, w, b, win, residual_of(inputs))]
    n, c = x.shape[:2]
    m = w.shape[0]
    _, sl = next(window.taps(win))
    xs = window.pad(x, win)[(slice(None), slice(None), *sl)]
    xs = xs.reshape(n, group, c // group, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, c // group), xs)
    return [_finish(y, b, win, x.dtype, residual_of(inputs))]


def conv_1x1_bias_row(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv with the bias as one more GEMM column: [W | b] @ [X; 1].

    Copying the (small) input once is cheaper than a bias pass over the output when the
    output has many more channels than the input (MobileNet's expansion convs, 6x).
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if b is None or group != 1 or x.ndim < 3 or any(k != 1 for k in win.kernel) or win.padded:
        return conv_1x1(inputs, attrs)
    if _pointwise_channels_last(x, w.shape[0], group, win):
        return [_conv_1x1_channels_last(x, w, b, win, residual_of(inputs))]
    n, c = x.shape[:2]
    m, p = w.shape[0], math.prod(win.out)
    dtype = np.result_type(x, w, b)
    _, sl = next(window.taps(win))
    rows = scratch(PING, (n, c + 1, p), dtype)
    np.copyto(rows[:, :c].reshape(n, c, *win.out), x[(slice(None), slice(None), *sl)])
    rows[:, c] = 1
    weights = np.empty((m, c + 1), dtype=dtype)
    weights[:, :c] = w.reshape(m, c)
    weights[:, c] = b
    y = np.matmul(weights, rows).reshape(n, m, *win.out)
    return [_epilogue(y, residual_of(inputs), None).astype(x.dtype, copy=False)]


def _pointwise_channels_last(x: np.ndarray, m: int, group: int, win: window.Window) -> bool:
    """Whether a 1x1 conv runs channels last: on a channels-last input, with enough pixels for
    the (pixels, C) @ (C, M) GEMM to be as fast as the NCHW one (see conv_im2col_hwc)."""
    wide = 2 * math.prod(win.out) >= m
    return group == 1 and wide and not win.padded and _channels_last_view(x)


def _conv_1x1_channels_last(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, win: window.Window, residual: np.ndarray | None
) -> np.ndarray:
    """A 1x1 conv of a channels-last input as (pixels, C) @ (C, M), its result left channels
    last too: transposing the input to NCHW and the output back would cost two copies."""
    n, c = x.shape[:2]
    m, (ho, wo) = w.shape[0], win.out
    dtype = np.result_type(x, w)
    _, sl = next(window.taps(win))
    pixels = x[(slice(None), slice(None), *sl)].transpose(0, 2, 3, 1)
    if not pixels.flags.c_contiguous or pixels.dtype != dtype:  # strided: gather whole channel runs
        gathered = scratch(PING, pixels.shape, dtype)
        np.copyto(gathered, pixels)
        pixels = gathered
    buffer = np.empty((n, ho, wo, m), dtype=dtype)
    np.matmul(pixels.reshape(-1, c), w.reshape(m, c).T.astype(dtype, copy=False), out=buffer.reshape(-1, m))
    if b is not None:
        buffer += b.astype(dtype, copy=False)
    return _epilogue(buffer.transpose(0, 3, 1, 2), residual, None).astype(x.dtype, copy=False)


def _patches_ok(x: np.ndarray, w: np.ndarray, group: int, win: window.Window) -> bool:
    return (
        x.ndim == 4
        and group == 1
        and win.kernel == win.strides
        and not win.padded
        and all(d == 1 for d in win.dilations)
    )


def conv_patches(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A conv whose windows tile the image without overlap (kernel == stride, no padding: a
    vision transformer's patch embedding): the columns are the image's own blocks, so one
    transposing copy gathers them and one (M, K) @ (K, L) GEMM writes NCHW directly.
    Measured on ViT-Tiny's 16x16/16 embedding: 0.65 ms against im2col's 1.29 ms."""
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _patches_ok(x, w, group, win):
        return conv_im2col(inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (oh, ow), m = win.kernel, win.out, w.shape[0]
    dtype = np.result_type(x, w)
    cols = scratch(PING, (n, c, kh, kw, oh, ow), dtype)
    blocks = x[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw)
    np.copyto(cols, blocks.transpose(0, 1, 3, 5, 2, 4))
    y = np.matmul(w.reshape(m, c * kh * kw).astype(dtype, copy=False), cols.reshape(n, c * kh * kw, oh * ow))
    if b is not None:
        y += b.astype(dtype, copy=False)[:, None]
    return [_epilogue(y.reshape(n, m, oh, ow), residual_of(inputs), None).astype(x.dtype, copy=False)]
