"""Depthwise Conv as a JIT kernel (numba): the twin of depthwise.py's numpy forms.

numpy's depthwise forms make one pass over the image per tap (or an einsum over strided taps),
plus passes for the bias, residual and clip; here each output row is built once in L1 from the
input rows it needs, taps, then bias, residual and Relu / Clip, so the image is read once and
the output written once.  The innermost loop runs along an output row with a constant input
stride (contiguous for stride 1 on NCHW input), which LLVM vectorises without reassociating
any sum: results match the numpy forms to float32 rounding, no fastmath needed.  Every
(image, channel) plane is independent: the parallel variant spreads them over threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.ops.conv.common import (
    _check_residual,
    _clipped_fallback,
    _prepare,
    clip_floats,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.depthwise import conv_depthwise
from engine.ops.registry import Kernel

# inputs may be read-only (weights mapped from the package, plan constants) and any layout
_F32, _I64, _BOOL = types.float32, types.int64, types.boolean
_GEOMETRY = (_BOOL, _BOOL, _F32, _F32, _I64, _I64, _I64, _I64, _I64, _I64)
_ROWS = types.void(
    jit.array(_F32, 2, "C", readonly=True),
    jit.array(_F32, 2, "C", readonly=True),
    jit.array(_F32, 1, "C"),
    *(_I64,) * 9,
)
_COLUMN = _F32(jit.array(_F32, 2, "C", readonly=True), jit.array(_F32, 2, "C", readonly=True), *(_I64,) * 4)
_ROW_IN = jit.array(_F32, 1, "C", readonly=True)
_ROW3 = types.void(
    _ROW_IN,
    _ROW_IN,
    _ROW_IN,
    jit.array(_F32, 2, "C", readonly=True),
    _F32,
    jit.array(_F32, 1, "C"),
    _I64,
    _I64,
)
_ROW3_UNIT = types.void(
    _ROW_IN, _ROW_IN, _ROW_IN, jit.array(_F32, 2, "C", readonly=True), _F32, jit.array(_F32, 1, "C"), _I64
)
# ... then the (image, channel) planes [first, last) to compute
_PLANES = types.void(
    jit.array(_F32, 4, "C", readonly=True),
    jit.array(_F32, 3, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 4, "C"),
    jit.array(_F32, 4, "A", readonly=True),
    *_GEOMETRY,
    _I64,
    _I64,
)


@jit.njit([_ROWS])
def _taps_general(x, wk, row, oh, first, last, sh, sw, dh, dw, pt, pl):  # noqa: ANN001, ANN202
    """Adds every tap to output columns [first, last) of row ``oh``, skipping the padding."""
    height, width = x.shape
    kh, kw = wk.shape
    for i in range(kh):
        ih = oh * sh - pt + i * dh
        if ih < 0 or ih >= height:
            continue
        xrow = x[ih]
        for j in range(kw):
            weight = wk[i, j]
            offset = j * dw - pl
            start = max(first, (sw - 1 - offset) // sw)  # the first column reading inside the row
            stop = min(last, (width - 1 - offset) // sw + 1)
            if stop <= start:
                continue
            # slices indexed from 0: numba then needs no negative-index wraparound test, which
            # would keep LLVM from vectorising the loop
            dst = row[start:stop]
            if sw == 1:
                src = xrow[start + offset : stop + offset]
                for k in range(stop - start):
                    dst[k] += weight * src[k]
            else:
                strided = xrow[start * sw + offset : (stop - 1) * sw + offset + 1 : sw]
                for k in range(stop - start):
                    dst[k] += weight * strided[k]


@jit.njit([_COLUMN])
def _column(x, wk, top, left, dh, dw):  # noqa: ANN001, ANN202
    """The taps of one output (window corner at row ``top``, column ``left``) inside the image:
    the few border outputs, one scalar sum each."""
    height, width = x.shape
    total = np.float32(0)
    for i in range(wk.shape[0]):
        ih = top + i * dh
        if 0 <= ih < height:
            for j in range(wk.shape[1]):
                iw = left + j * dw
                if 0 <= iw < width:
                    total += wk[i, j] * x[ih, iw]
    return total


@jit.njit([_ROW3])
def _row3x3(x0, x1, x2, wk, bias, dst, q0, sw):  # noqa: ANN001, ANN202
    """dst[k] = the 9 taps of a 3x3 window (+ bias) whose top-left input is column q0 + k * sw of
    rows x0..x2, all inside the image: one store per output, the taps in registers."""
    n = dst.shape[0]
    span = (n - 1) * sw + 1
    a0, a1, a2 = x0[q0 : q0 + span : sw], x0[q0 + 1 : q0 + 1 + span : sw], x0[q0 + 2 : q0 + 2 + span : sw]
    b0, b1, b2 = x1[q0 : q0 + span : sw], x1[q0 + 1 : q0 + 1 + span : sw], x1[q0 + 2 : q0 + 2 + span : sw]
    c0, c1, c2 = x2[q0 : q0 + span : sw], x2[q0 + 1 : q0 + 1 + span : sw], x2[q0 + 2 : q0 + 2 + span : sw]
    w00, w01, w02 = wk[0, 0], wk[0, 1], wk[0, 2]
    w10, w11, w12 = wk[1, 0], wk[1, 1], wk[1, 2]
    w20, w21, w22 = wk[2, 0], wk[2, 1], wk[2, 2]
    for k in range(n):
        # the taps in (i, j) order, then the bias: the order numpy's kernels and onnx's
        # reference sum in, so float32 rounding agrees with theirs
        total = w00 * a0[k] + w01 * a1[k] + w02 * a2[k] + w10 * b0[k] + w11 * b1[k] + w12 * b2[k]
        dst[k] = total + w20 * c0[k] + w21 * c1[k] + w22 * c2[k] + bias


@jit.njit([_ROW3_UNIT])
def _row3x3_unit(x0, x1, x2, wk, bias, dst, q0):  # noqa: ANN001, ANN202
    """_row3x3 at stride 1, on contiguous slices (so LLVM vectorises it)."""
    n = dst.shape[0]
    a0, a1, a2 = x0[q0 : q0 + n], x0[q0 + 1 : q0 + 1 + n], x0[q0 + 2 : q0 + 2 + n]
    b0, b1, b2 = x1[q0 : q0 + n], x1[q0 + 1 : q0 + 1 + n], x1[q0 + 2 : q0 + 2 + n]
    c0, c1, c2 = x2[q0 : q0 + n], x2[q0 + 1 : q0 + 1 + n], x2[q0 + 2 : q0 + 2 + n]
    w00, w01, w02 = wk[0, 0], wk[0, 1], wk[0, 2]
    w10, w11, w12 = wk[1, 0], wk[1, 1], wk[1, 2]
    w20, w21, w22 = wk[2, 0], wk[2, 1], wk[2, 2]
    for k in range(n):
        # the taps in (i, j) order, then the bias: the order numpy's kernels and onnx's
        # reference sum in, so float32 rounding agrees with theirs
        total = w00 * a0[k] + w01 * a1[k] + w02 * a2[k] + w10 * b0[k] + w11 * b1[k] + w12 * b2[k]
        dst[k] = total + w20 * c0[k] + w21 * c1[k] + w22 * c2[k] + bias


@jit.njit([_PLANES])
def _planes(x, wk, bias, out, res, has_res, has_clip, lo, hi, sh, sw, dh, dw, pt, pl, first, last):  # noqa: ANN001, ANN202
    """Planes [first, last) (index = image * C + channel), each output row built once: called
    for all planes (one thread) or per plane by ``_planes_parallel`` -- one compiled body for
    both, where a per-plane function was compiled apart and then again inside each caller."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    dense3 = wk.shape[1] == 3 and wk.shape[2] == 3 and dh == 1 and dw == 1
    inner_first = (pl + sw - 1) // sw  # the columns whose 3 taps are all inside the row
    inner_last = min(wo, (width - 3 + pl) // sw + 1)
    for index in range(first, last):
        n, c = index // channels, index % channels
        plane, kernel, b, target = x[n, c], wk[c], bias[c], out[n, c]
        extra = res[n, c] if has_res else res[0, 0]
        for oh in range(ho):
            row = target[oh]
            top = oh * sh - pt
            if dense3 and top >= 0 and top + 2 < height and inner_last > inner_first:
                q0 = inner_first * sw - pl
                inner = row[inner_first:inner_last]
                if sw == 1:
                    _row3x3_unit(plane[top], plane[top + 1], plane[top + 2], kernel, b, inner, q0)
                else:
                    _row3x3(plane[top], plane[top + 1], plane[top + 2], kernel, b, inner, q0, sw)
                for ow in range(inner_first):
                    row[ow] = _column(plane, kernel, top, ow * sw - pl, dh, dw) + b
                for ow in range(inner_last, wo):
                    row[ow] = _column(plane, kernel, top, ow * sw - pl, dh, dw) + b
            else:
                for ow in range(wo):
                    row[ow] = 0
                _taps_general(plane, kernel, row, oh, 0, wo, sh, sw, dh, dw, pt, pl)
                for ow in range(wo):
                    row[ow] += b
            if has_res:
                rrow = extra[oh]
                for ow in range(wo):
                    row[ow] += rrow[ow]
            if has_clip:
                for ow in range(wo):
                    value = row[ow]
                    if value < lo:  # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                        row[ow] = lo
                    elif value > hi:
                        row[ow] = hi


@jit.njit([_PLANES], parallel=True)
def _planes_parallel(x, wk, bias, out, res, has_res, has_clip, lo, hi, sh, sw, dh, dw, pt, pl, first, last):  # noqa: ANN001, ANN202
    for index in prange(first, last):
        _planes(x, wk, bias, out, res, has_res, has_clip, lo, hi, sh, sw, dh, dw, pt, pl, index, index + 1)


# Channels last: each output pixel is a run of C channels, each tap one multiply-add over that
# run (contiguous in input, weights and output) -- the form for small images with many channels,
# where NCHW rows are too short to vectorise (MobileNetV2's 14x14 and 7x7 layers).
_PIXELS = types.void(
    jit.array(_F32, 4, "C", readonly=True),
    jit.array(_F32, 3, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 4, "C"),
    jit.array(_F32, 4, "A", readonly=True),
    *_GEOMETRY,
    _I64,
    _I64,
)


_PIXEL_IN = jit.array(_F32, 2, "C", readonly=True)


@jit.njit(
    [
        types.void(
            _PIXEL_IN,
            _PIXEL_IN,
            _PIXEL_IN,
            _I64,
            _I64,
            jit.array(_F32, 3, "C", readonly=True),
            jit.array(_F32, 1, "C", readonly=True),
            jit.array(_F32, 2, "C"),
            jit.array(_F32, 2, "A", readonly=True),
            _BOOL,
            _BOOL,
            _F32,
            _F32,
        )
    ],
    # contract: a*b+c as one fused multiply-add (one rounding, not two): twice the taps per cycle
    fastmath={"contract"},
)
def _pixels3x3(r0, r1, r2, q0, sw, wk, bias, dst, extra, has_res, has_clip, lo, hi):  # noqa: ANN001, ANN202
    """Output pixels dst[k] (each C channels) from 3x3 windows inside the image, top-left input
    column q0 + k * sw of rows r0..r2 (each (W, C)): one loop over the channels per pixel with
    the nine taps summed in registers and one store, where the general path adds each tap into
    the output in turn."""
    channels = dst.shape[1]
    for k in range(dst.shape[0]):
        q = q0 + k * sw
        for c in range(channels):
            # the taps in (i, j) order, then the bias (then the residual): the order the numpy
            # kernels and onnx's reference sum in.  Indexing wk, the rows and dst directly, not
            # through per-pixel slices: each slice is a reference-counted view (two atomic calls)
            total = wk[0, 0, c] * r0[q, c] + wk[0, 1, c] * r0[q + 1, c] + wk[0, 2, c] * r0[q + 2, c]
            total = total + wk[1, 0, c] * r1[q, c] + wk[1, 1, c] * r1[q + 1, c] + wk[1, 2, c] * r1[q + 2, c]
            total = total + wk[2, 0, c] * r2[q, c] + wk[2, 1, c] * r2[q + 1, c] + wk[2, 2, c] * r2[q + 2, c]
            value = total + bias[c]
            if has_res:  # loop-invariant tests: LLVM unswitches them out of the loop
                value += extra[k, c]
            if has_clip:  # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                value = lo if value < lo else (hi if value > hi else value)
            dst[k, c] = value


@jit.njit([types.void(jit.array(_F32, 1, "C"), _F32, _F32)])
def _clip(dst, lo, hi):  # noqa: ANN001, ANN202
    for c in range(dst.shape[0]):
        value = dst[c]
        # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
        dst[c] = lo if value < lo else (hi if value > hi else value)


@jit.njit([_PIXELS])
def _pixels(x, wk, bias, out, res, has_res, has_clip, lo, hi, sh, sw, dh, dw, pt, pl, first_row, last_row):  # noqa: ANN001, ANN202
    """Output rows [first_row, last_row) (index = image * Ho + row), each (Wo, C): called for
    all rows (one thread) or per row by ``_pixels_parallel``, one compiled body for both."""
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    kh, kw, rows = wk.shape[0], wk.shape[1], out.shape[1]
    for index in range(first_row, last_row):
        n, oh = index // rows, index % rows
        image, target = x[n], out[n, oh]
        extra = res[n, oh] if has_res else res[0, 0]
        top = oh * sh - pt  # the row's first input row
        first, last = 0, 0  # the output columns whose 3x3 windows lie inside the image
        if kh == 3 and kw == 3 and dh == 1 and dw == 1 and top >= 0 and top + 2 < height:
            first, last = (pl + sw - 1) // sw, min(target.shape[0], (width - 3 + pl) // sw + 1)
        if last > first:
            inner = target[first:last]
            inner_extra = extra[first:last] if has_res else extra
            r0, r1, r2, q0 = image[top], image[top + 1], image[top + 2], first * sw - pl
            _pixels3x3(r0, r1, r2, q0, sw, wk, bias, inner, inner_extra, has_res, has_clip, lo, hi)
        for ow in range(target.shape[0]):
            if first <= ow < last:
                continue
            dst = target[ow]
            left = ow * sw - pl
            for c in range(channels):
                dst[c] = 0
            for i in range(kh):
                ih = top + i * dh
                if ih < 0 or ih >= height:
                    continue
                for j in range(kw):
                    iw = left + j * dw
                    if iw < 0 or iw >= width:
                        continue
                    src, weight = image[ih, iw], wk[i, j]
                    for c in range(channels):
                        dst[c] += weight[c] * src[c]
            for c in range(channels):  # after the taps, as the numpy kernels add it
                dst[c] += bias[c]
            if has_res:
                pixel = extra[ow]
                for c in range(channels):
                    dst[c] += pixel[c]
            if has_clip:
                _clip(dst, lo, hi)


@jit.njit([_PIXELS], parallel=True)
def _pixels_parallel(
    x, wk, bias, out, res, has_res, has_clip, lo, hi, sh, sw, dh, dw, pt, pl, first_row, last_row
):  # noqa: ANN001, ANN202
    for index in prange(first_row, last_row):
        _pixels(x, wk, bias, out, res, has_res, has_clip, lo, hi, sh, sw, dh, dw, pt, pl, index, index + 1)


_NO_RESIDUAL = np.zeros((1, 1, 1, 1), np.float32)


def depthwise_ok(x_shape: Sequence[int], w_shape: Sequence[int], group: int) -> bool:
    """One 2-D filter per channel (depth multiplier 1)."""
    return len(x_shape) == 4 and len(w_shape) == 4 and group == x_shape[1] == w_shape[0] and w_shape[1] == 1


def _arguments(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> tuple | None:
    """(x, W (C, kh, kw), bias, residual, flags and geometry) for the JIT loops, or None when
    the node is not a float32 depthwise conv (the kernels then fall back to numpy)."""
    x, w, b, group, win = _prepare(inputs, attrs)
    residual = residual_of(inputs)
    plain = x.dtype == w.dtype == np.float32 and (b is None or b.dtype == np.float32)
    if not (plain and depthwise_ok(x.shape, w.shape, group)) or (
        residual is not None and residual.dtype != x.dtype
    ):
        return None
    n, c = x.shape[:2]
    if residual is not None:
        _check_residual(residual, (n, c, *win.out))
    bias = np.zeros(c, np.float32) if b is None else np.ascontiguousarray(b)
    flags = (
        residual is not None,
        *clip_floats(fused_bounds(attrs)),
        *win.strides,
        *win.dilations,
        *win.pads_begin,
    )
    return x, w.reshape(c, *win.kernel), bias, residual, flags, win.out


def conv_depthwise_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Depthwise 2-D conv of float32 input (NCHW rows), any stride, dilation and padding, with
    bias, residual and a fused Relu / Clip (``fuses_clip``) in the same pass."""
    found = _arguments(inputs, attrs)
    if found is None:
        return _clipped_fallback(conv_depthwise, inputs, attrs)
    x, wk, bias, residual, flags, out_hw = found
    out = np.empty((*x.shape[:2], *out_hw), np.float32)
    x = np.ascontiguousarray(x)  # a channels-last view becomes NCHW: the row loops need it
    res = _NO_RESIDUAL if residual is None else residual
    planes = x.shape[0] * x.shape[1]
    jit.run(_planes, _planes_parallel, x, np.ascontiguousarray(wk), bias, out, res, *flags, 0, planes)
    return [out]


def conv_depthwise_jit_nhwc(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The same conv computed channels last (one multiply-add per tap over a pixel's channels),
    its result a channels-last view as the numpy channels-last kernels leave theirs."""
    found = _arguments(inputs, attrs)
    if found is None:
        return _clipped_fallback(conv_depthwise, inputs, attrs)
    x, wk, bias, residual, flags, out_hw = found
    n, c = x.shape[:2]
    pixels = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # free for a channels-last view
    out = np.empty((n, *out_hw, c), np.float32)
    res = _NO_RESIDUAL if residual is None else residual.transpose(0, 2, 3, 1)
    taps = np.ascontiguousarray(wk.transpose(1, 2, 0))
    jit.run(_pixels, _pixels_parallel, pixels, taps, bias, out, res, *flags, 0, n * out_hw[0])
    return [out.transpose(0, 3, 1, 2)]


for _kernel in (conv_depthwise_jit, conv_depthwise_jit_nhwc):
    _kernel.fuses_clip = True  # type: ignore[attr-defined]
    _kernel.jit = True  # type: ignore[attr-defined]


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if len(shapes) < 2:
        return []
    x_shape, w_shape = shapes[0], shapes[1]
    if x_shape is None or w_shape is None or not depthwise_ok(x_shape, w_shape, int(attrs.get("group", 1))):
        return []
    return [conv_depthwise_jit, conv_depthwise_jit_nhwc]


CANDIDATES = {"Conv": _conv_candidates}
