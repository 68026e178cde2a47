"""QdqConv in integers (numba): uint8 patches times the int8 filter on int8_gemm_jit's GEMM.

The image is read channels last (a conv's result here is channels last already; the first
layer's input is transposed once), so a patch's row is its taps' runs of C bytes, in (ky, kx, c)
order, copied as they are; padding takes the activations' zero point (the value that stands
for 0.0).  A 1x1 stride-1 unpadded conv with C a multiple of 4 needs no copy at all.  The GEMM's
[pixels, O] result is the conv's output channels last, returned as an NCHW view; bias, residual
and activation follow QdqConv's unfused form (qdq_conv.py): activation(conv + B + residual).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import types

from engine import jit
from engine.ops import window
from engine.ops.fused import apply_activation
from engine.ops.int8_gemm_jit import ROWS, gemm, pack_weights
from engine.ops.qdq_conv import qdq_conv, qdq_conv_operands
from engine.ops.registry import Kernel

_I = types.int64
# x [H, W, C] uint8, kernel (kh, kw), strides, pads (top, left), dilations, out (oh, ow), zero
# point, then the patches [P', depth] uint8
_PATCHES = types.void(
    jit.array(types.uint8, 3, "C", readonly=True), _I, _I, _I, _I, _I, _I, _I, _I, _I, _I, types.uint8,
    jit.array(types.uint8, 2, "C"),
)  # fmt: skip


@jit.njit([_PATCHES])
def _patches(x, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, zero, out):  # noqa: ANN001, ANN202
    height, width, channels = x.shape
    for oy in range(oh):
        for ox in range(ow):
            row = out[oy * ow + ox]
            for ky in range(kh):
                iy = oy * sh - pt + ky * dh
                for kx in range(kw):
                    ix = ox * sw - pl + kx * dw
                    base = (ky * kw + kx) * channels
                    if 0 <= iy < height and 0 <= ix < width:
                        source = x[iy, ix]
                        for c in range(channels):
                            row[base + c] = source[c]
                    else:
                        for c in range(channels):
                            row[base + c] = zero


def pack(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> dict[int, np.ndarray]:
    """The filter as the GEMM's packed [K, O] weights, K in (ky, kx, c) order (input 3), and
    their column sums (an input 7 of their own)."""
    if not qdq_conv_operands(inputs, attrs):
        return {}
    w = inputs[3]
    packed, colsum = pack_weights(np.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(-1, w.shape[0]))
    return {3: packed, 7: colsum}


def qdq_conv_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs as qdq_conv's, the filter packed (1-D) with its column sums as input 7 once planned."""
    inputs = list(inputs) + [None] * (8 - len(inputs))
    q, a_scale, a_zero, w, w_scale, bias, residual, colsum = inputs[:8]
    if w.ndim != 1:  # not packed (a first run): as the unfused form
        if not qdq_conv_operands(inputs[:7], attrs):
            return qdq_conv(inputs[:7], attrs)
        packed = pack(inputs[:7], attrs)
        w, colsum = packed[3], packed[7]
    out_channels = w_scale.size
    kernel = tuple(attrs["kernel_shape"])  # the planner writes it (the packed filter has no shape)
    channels = q.shape[1]
    win = window.geometry(attrs, tuple(q.shape[2:]), kernel)
    oh, ow = win.out
    depth = -(-kernel[0] * kernel[1] * channels // 4) * 4
    pixels = oh * ow
    images = q.shape[0]
    products = [  # a batch: one image's patches at a time
        gemm(
            _image_rows(q[image], a_zero, kernel, win, depth),
            w,
            colsum,
            a_scale,
            a_zero,
            w_scale,
            bias,
            pixels,
        )
        for image in range(images)
    ]
    y = products[0][None] if images == 1 else np.stack(products)
    if residual is not None:  # a skip connection: usually a conv's output, channels last too
        y.reshape(images, oh, ow, out_channels)[...] += residual.transpose(0, 2, 3, 1)
    y = apply_activation(y, attrs)
    return [y.reshape(images, oh, ow, out_channels).transpose(0, 3, 1, 2)]  # NCHW, channels last


def _image_rows(
    image: np.ndarray, a_zero: np.ndarray, kernel: tuple, win: window.Window, depth: int
) -> np.ndarray:
    """One image's uint8 patches [pixels padded to ROWS, depth], or its pixels as they are for
    a 1x1 stride-1 unpadded conv whose channels 4 divides."""
    channels = image.shape[0]
    oh, ow = win.out
    pixels = oh * ow
    x = np.ascontiguousarray(image.transpose(1, 2, 0))  # free when it is channels last already
    simple = kernel == (1, 1) and win.strides == (1, 1) and not any(win.pads_begin) and channels % 4 == 0
    if simple and pixels % ROWS == 0:
        return x.reshape(pixels, channels)
    rows = np.zeros((-(-pixels // ROWS) * ROWS, depth), np.uint8)
    (sh, sw), (pt, pl), (dh, dw) = win.strides, win.pads_begin, win.dilations
    _patches(x, kernel[0], kernel[1], sh, sw, pt, pl, dh, dw, oh, ow, np.uint8(a_zero), rows)
    return rows


qdq_conv_jit.jit = True  # type: ignore[attr-defined]
qdq_conv_jit.pack = pack  # type: ignore[attr-defined]


def _candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    return [qdq_conv_jit]


CANDIDATES = {"QdqConv": _candidates}
