"""Conv as im2col + GEMM: the general kernel, exact phase windows for strided convs, and a
channels-last form with tap-major packed weights."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv.common import (
    COLUMN_BUDGET_BYTES,
    PING,
    _clipped_fallback,
    _epilogue,
    _finish,
    _flat_phases,
    _in_batches,
    _padded_channels_last,
    _prepare,
    _Result,
    fused_bounds,
    residual_of,
)
from engine.ops.scratch import scratch


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
        cols = scratch(PING, (part.shape[0], c, k, *win.out), dtype)
        np.stack([part[(slice(None), slice(None), *sl)] for _, sl in window.taps(win)], axis=2, out=cols)
        cols = cols.reshape(part.shape[0], group, (c // group) * k, p)
        np.matmul(wmat, cols, out=y[start : start + chunk])
    return [_finish(y, b, win, x.dtype, residual_of(inputs))]


def conv_im2col_phased(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Strided 2-D im2col whose columns are copied from the ``_flat_phases`` split as exact
    (Ho, Wo) windows: no junk columns, so the GEMM writes the output directly (bias as a
    row of ones under the columns) and a fused Relu / Clip (``fuses_clip``) is one
    contiguous pass in place.  Measured on ResNet's 7x7/2 stem: 3.2-3.5 ms against 3.9-4.3
    for whole flat rows with junk columns cropped after the GEMM (a variant now removed)."""
    x, w, b, group, win = _prepare(inputs, attrs)
    if x.ndim != 4 or group != 1:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    m, depth = w.shape[0], c * kh * kw
    dtype = np.result_type(x, w)
    if n > 1 and n * (depth + 1) * ho * wo * dtype.itemsize > COLUMN_BUDGET_BYTES:
        return _in_batches(conv_im2col_phased, inputs, attrs, (depth + 1) * ho * wo * dtype.itemsize)
    flat, hph, wph = _flat_phases(x.astype(dtype, copy=False), win)
    phases = flat.reshape(sh * sw, n, c, hph, wph)
    cols = scratch(PING, (n, depth + (b is not None), ho * wo), dtype)
    taps = cols[:, :depth].reshape(n, c, kh * kw, ho, wo)
    for tap, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        r, q = i * dh // sh, j * dw // sw
        np.copyto(taps[:, :, tap], phases[(i * dh % sh) * sw + j * dw % sw, :, :, r : r + ho, q : q + wo])
    wmat = w.reshape(m, depth).astype(dtype, copy=False)
    if b is not None:
        cols[:, depth] = 1
        wmat = np.concatenate([wmat, b.reshape(m, 1).astype(dtype)], axis=1)
    y = np.empty((n, m, ho, wo), dtype=dtype)
    np.matmul(wmat, cols, out=y.reshape(n, m, ho * wo))
    return [_epilogue(y, residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]


conv_im2col_phased.fuses_clip = True  # type: ignore[attr-defined]


# Below this many input channels the channels-last columns' inner runs are too short to pay
# for the transposing copy (ResNet's 3-channel stem: 5.0 ms against 3.4 for exact phases).
HWC_MIN_CHANNELS = 16


def hwc_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    return len(x_shape) == 4 and len(w_shape) == 4 and int(attrs.get("group", 1)) == 1


def pack_im2col_hwc(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights -> (M, kh*kw*C): tap-major rows, the order of the columns below."""
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(w.shape[0], -1)


def conv_im2col_hwc(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """2-D im2col over a channels-last copy of the input; input 1 may be pre-packed by
    ``pack_im2col_hwc`` (then ``kernel_shape`` must be given).  Each (output pixel, tap) run of
    the columns is a whole channel vector, so one strided copy with contiguous inner runs
    gathers them: on ResNet's 7x7, 512-channel layers the NCHW taps copy 7 floats at a time
    (0.24 ms against 0.03).  Then (M, K) @ columns^T writes NCHW; bias and a fused Relu / Clip
    (``fuses_clip``) follow on the output."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if w.ndim == 4:
        if not hwc_ok(x.shape, w.shape, attrs):
            return _clipped_fallback(conv_im2col, inputs, attrs)
        x, w, b, _, win = _prepare(inputs, attrs)
        w = pack_im2col_hwc(w)
    else:
        win = window.geometry(attrs, tuple(x.shape[2:]), tuple(attrs["kernel_shape"]))
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    m, depth = w.shape[0], kh * kw * c
    dtype = np.result_type(x, w)
    per_image = depth * ho * wo * dtype.itemsize
    if n > 1 and n * per_image > COLUMN_BUDGET_BYTES:
        known = {**attrs, "kernel_shape": list(win.kernel)}  # w is packed from here on
        return _in_batches(conv_im2col_hwc, [x, w, b, *inputs[3:]], known, per_image)
    xp = _padded_channels_last(x, win, dtype)
    s_n, s_h, s_w, s_c = xp.strides
    taps = np.lib.stride_tricks.as_strided(
        xp, (n, ho, wo, kh, kw, c), (s_n, sh * s_h, sw * s_w, dh * s_h, dw * s_w, s_c)
    )
    cols = scratch(PING, (n, ho, wo, kh, kw, c), dtype)
    np.copyto(cols, taps)
    # columns @ W^T leaves the result channels last, as the Winograd forms do; with fewer pixels
    # than half the filters OpenBLAS runs that GEMM slower than W @ columns^T (ResNet's 7x7,
    # 512-channel stage: 1.75 ms against 1.41), so those write NCHW
    if 2 * ho * wo >= m:
        result = _Result(n, m, (ho, wo), (ho, wo), dtype)
        np.matmul(cols.reshape(-1, depth), w.astype(dtype, copy=False).T, out=result.buffer.reshape(-1, m))
        if b is not None:
            result.buffer += b.astype(dtype, copy=False)
        return [result.finish(residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]
    y = np.empty((n, m, ho, wo), dtype=dtype)
    np.matmul(
        w.astype(dtype, copy=False),
        cols.reshape(n, ho * wo, depth).transpose(0, 2, 1),
        out=y.reshape(n, m, ho * wo),
    )
    if b is not None:
        y += b.astype(dtype, copy=False).reshape(m, 1, 1)
    return [_epilogue(y, residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]


conv_im2col_hwc.fuses_clip = True  # type: ignore[attr-defined]
conv_im2col_hwc.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_im2col_hwc(inputs[1])}
    if attrs.get("kernel_shape") and hwc_ok(inputs[0].shape, inputs[1].shape, attrs)
    else {}
)
