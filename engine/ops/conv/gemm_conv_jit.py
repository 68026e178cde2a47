"""Convs on the JIT GEMM (gemm_jit.py): a 1x1 conv as (pixels, C) @ (C, M), and a k x k conv of
one group as channels-last im2col columns, (pixels, kh*kw*C) @ (kh*kw*C, M).  Both leave their
result channels last, with bias, residual and a fused Relu / Clip applied per tile in registers,
and both take weights packed once per plan (``pack_pointwise``, ``pack_columns``).  The search
offers them beside gemm8_jit's 16-wide forms of the same convs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import types

from engine import jit, team
from engine.ops import window
from engine.ops.conv.common import (
    COLUMN_BUDGET_BYTES,
    PING,
    NodeMemo,
    _clipped_fallback,
    _in_batches,
    _padded_channels_last,
    aligned_empty,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.direct import conv_1x1
from engine.ops.conv.gemm_jit import (
    MR,
    NO_RESIDUAL,
    NR,
    _gemm_items,
    _gemm_parallel,
    _plain,
    _unpacked,
    address,
    block_rows_for,
    gemm,
    pack_panels,
    packed_shape,
)
from engine.ops.conv.im2col import HWC_MIN_CHANNELS, conv_im2col, hwc_ok, pack_im2col_hwc
from engine.ops.conv.pointwise_jit import Panels, _pixels, gemm_setup, pointwise_ok, residual_rows
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch


def pack_pointwise(w: np.ndarray) -> np.ndarray:
    """(M, C, 1, 1) weights -> panels of the (C, M) right-hand side."""
    return pack_panels(w.reshape(w.shape[0], w.shape[1]).T)


_POINTWISE = NodeMemo()
_PANELS = Panels(NR, packed_shape, pack_pointwise, block_rows_for)


def conv_1x1_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv of float32 input as (pixels, C) @ (C, M) on the micro-kernel, its result channels
    last, bias, residual and a fused Relu / Clip (``fuses_clip``) applied per tile in registers;
    input 1 may be pre-packed by ``pack_pointwise``."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    found = _POINTWISE.get(attrs, (w, b), x, lambda: gemm_setup(x, w, b, attrs, _PANELS))
    if found is None or (residual is not None and residual.dtype != np.float32):
        if w.ndim == 3:  # a plan's packed weights with shapes it was not packed for: unpack them
            inputs = [x, _unpacked(w, (1, 1)), *inputs[2:]]
        return _clipped_fallback(conv_1x1, inputs, attrs)
    weights, vector, (has_clip, lo, hi), strides, shape, blocks, items, macs = found
    n, ho, wo, m = shape
    pixels = _pixels(x, strides)  # C-contiguous (N, Ho, Wo, C): flat below without a copy
    out = aligned_empty(shape, np.float32, address)
    res = NO_RESIDUAL if residual is None else residual_rows(residual, (n, m, ho, wo))
    # few Python steps: ~8 us of them a call were as much as a 7x7 layer's GEMM
    parallel = team.worth_sharing(macs) and pixels.size // pixels.shape[3] * len(vector) >= 2 * MR * NR
    args = (
        pixels.reshape(-1),
        weights,
        out.reshape(-1),
        vector,
        res.reshape(-1),
        residual is not None,
        has_clip,
    )
    rows, block = n * ho * wo, blocks[parallel]
    geometry = (lo, hi, rows, pixels.shape[3], m, res.shape[-1], block, 0, items[parallel])
    team.run(team.GEMM32, _gemm_items, _gemm_parallel, *args, *geometry, shared=parallel)
    return [out.transpose(0, 3, 1, 2)]


conv_1x1_gemm.fuses_clip = True  # type: ignore[attr-defined]
conv_1x1_gemm.jit = True  # type: ignore[attr-defined]
conv_1x1_gemm.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_pointwise(inputs[1])} if pointwise_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


def pack_columns(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights -> panels of the (kh*kw*C, M) right-hand side, tap-major rows: the
    order of the channels-last columns."""
    return pack_panels(pack_im2col_hwc(w).T)


@jit.njit(
    [
        types.void(
            jit.array(types.float32, 3, "A", readonly=True),
            jit.array(types.float32, 2, "C"),
            *(types.int64,) * 9,
        )
    ]
)
def _gather_columns(x, cols, kh, kw, sh, sw, dh, dw, pt, pl, wo):  # noqa: ANN001, ANN202
    """One (C, H, W) image's channels-last columns: cols[p, (i*kw + j)*C + c] = the padded
    input under tap (i, j) of output pixel p, channel c (zero in the padding).  One loop per
    (output row, tap, channel) along the output row, the padding's columns cut off first."""
    channels, height, width = x.shape
    for oh in range(cols.shape[0] // wo):
        base = oh * wo
        for i in range(kh):
            ih = oh * sh - pt + i * dh
            for j in range(kw):
                offset = j * dw - pl
                first = min(wo, max(0, (sw - 1 - offset) // sw))  # the first column inside the row
                last = max(first, min(wo, (width - 1 - offset) // sw + 1))
                for c in range(channels):
                    at = (i * kw + j) * channels + c
                    if ih < 0 or ih >= height:
                        first_in, last_in = wo, wo
                    else:
                        first_in, last_in = first, last
                    for ow in range(first_in):
                        cols[base + ow, at] = 0
                    for ow in range(first_in, last_in):
                        cols[base + ow, at] = x[c, ih, ow * sw + offset]
                    for ow in range(last_in, wo):
                        cols[base + ow, at] = 0


def conv_im2col_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """2-D conv of one group by channels-last columns (one gathering copy, as conv_im2col_hwc)
    and the micro-kernel GEMM, (pixels, kh*kw*C) @ (kh*kw*C, M), its result channels last, bias,
    residual and a fused Relu / Clip (``fuses_clip``) per tile; input 1 may be pre-packed by
    ``pack_columns`` (then ``kernel_shape`` must be given)."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    packed = w.ndim == 3
    kernel = tuple(attrs.get("kernel_shape") or ()) if packed else tuple(w.shape[2:])
    ok = len(kernel) == 2 and x.ndim == 4 and _plain(x, w, b, residual)
    if packed and ok:
        depth, m = packed_shape(w)
        ok = depth == x.shape[1] * kernel[0] * kernel[1]
        shape_w = (m, x.shape[1], *kernel)
    else:
        shape_w = tuple(w.shape)
    if not (ok and hwc_ok(x.shape, shape_w, attrs) and x.shape[1] == shape_w[1]):
        if packed and len(kernel) == 2:
            inputs = [x, _unpacked(w, kernel), *inputs[2:]]
        return _clipped_fallback(conv_im2col, inputs, attrs)
    weights = w if packed else pack_columns(w)
    win = window.geometry(attrs, tuple(x.shape[2:]), kernel)
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    m, depth = shape_w[0], kh * kw * c
    if n > 1 and n * depth * ho * wo * 4 > COLUMN_BUDGET_BYTES:
        known = {**attrs, "kernel_shape": list(win.kernel)}  # w is packed from here on
        return _in_batches(conv_im2col_gemm, [x, weights, b, *inputs[3:]], known, depth * ho * wo * 4)
    cols = scratch(PING, (n, ho, wo, kh, kw, c), np.float32)
    if c < HWC_MIN_CHANNELS:  # runs of a few floats: a JIT loop gathers them 3x faster than numpy
        geometry = (*win.strides, *win.dilations, *win.pads_begin)
        for image in range(n):
            _gather_columns(x[image], cols[image].reshape(ho * wo, depth), kh, kw, *geometry, wo)
    else:
        xp = _padded_channels_last(x, win, np.dtype(np.float32))
        s_n, s_h, s_w, s_c = xp.strides
        taps = np.lib.stride_tricks.as_strided(
            xp, (n, ho, wo, kh, kw, c), (s_n, sh * s_h, sw * s_w, dh * s_h, dw * s_w, s_c)
        )
        np.copyto(cols, taps)
    out = aligned_empty((n, ho, wo, m), np.float32, address)
    res = None if residual is None else residual_rows(residual, (n, m, ho, wo))
    gemm(cols.reshape(-1, depth), weights, out.reshape(-1, m), b, res, fused_bounds(attrs))
    return [out.transpose(0, 3, 1, 2)]


conv_im2col_gemm.fuses_clip = True  # type: ignore[attr-defined]
conv_im2col_gemm.jit = True  # type: ignore[attr-defined]
conv_im2col_gemm.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_columns(inputs[1])}
    if attrs.get("kernel_shape") and hwc_ok(inputs[0].shape, inputs[1].shape, attrs)
    else {}
)


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return []
    x_shape, w_shape = shapes[0], shapes[1]
    if pointwise_ok(x_shape, w_shape, attrs):
        return [conv_1x1_gemm, *gemm8_jit.candidates(attrs, shapes)]
    if hwc_ok(x_shape, w_shape, attrs) and len(w_shape) == 4 and x_shape[1] == w_shape[1]:
        return [conv_im2col_gemm, *gemm8_jit.candidates(attrs, shapes)]
    return []


CANDIDATES = {"Conv": _conv_candidates}

# the 16-wide (AVX2) forms; gemm8_jit imports this module back (a module reference), hence last
from engine.ops.conv import gemm8_jit  # noqa: E402
