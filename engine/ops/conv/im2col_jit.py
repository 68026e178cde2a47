"""im2col Conv channels last with a JIT epilogue (numba): for the small-channel convs (a
network's 3-channel stem) that start a channels-last chain.

numpy's channels-last im2col needs a transposing copy of the input first, too slow for 3
channels (im2col.py's HWC_MIN_CHANNELS), so a stem conv left its result NCHW and the layer after
it had to transpose it.  Here the columns are gathered as conv_im2col_phased gathers them
(exact windows of the input's stride phases, one contiguous copy per tap and channel), and the
GEMM takes them transposed, (pixels, K) @ (K, M), one block of pixels at a time: its output is
the channels-last result, and pointwise_jit's epilogue adds bias and residual and clips each
block while it is in cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv.common import PING, _clipped_fallback, _flat_phases, aligned_empty, residual_of
from engine.ops.conv.im2col import conv_im2col
from engine.ops.conv.pointwise_jit import NO_RESIDUAL, block_rows, epilogue, epilogue_flags, residual_rows
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch

# Below this many input channels numpy's channels-last im2col loses to exact phases (im2col.py);
# at and above it the numpy kernels gather whole channel runs as fast as this loop.
MAX_CHANNELS = 16


def im2col_ok(x_shape: Sequence[int], w_shape: Sequence[int], attrs: dict[str, Any]) -> bool:
    """A 2-D conv of one group on few channels."""
    return (
        len(x_shape) == 4
        and len(w_shape) == 4
        and int(attrs.get("group", 1)) == 1
        and x_shape[1] == w_shape[1]
        and x_shape[1] < MAX_CHANNELS
    )


def pack_columns(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights -> (C*kh*kw, M), rows in the columns' order: the GEMM's
    right-hand side."""
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


def conv_im2col_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """2-D conv of float32 input by JIT-gathered columns and one GEMM per block of output pixels,
    its result channels last, bias, residual and a fused Relu / Clip (``fuses_clip``) applied per
    block; input 1 may be pre-packed by ``pack_columns`` (then ``kernel_shape`` must be given)."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    packed = w.ndim == 2
    plain = x.dtype == w.dtype == np.float32 and (b is None or b.dtype == np.float32)
    kernel = tuple(attrs.get("kernel_shape") or ()) if packed else tuple(w.shape[2:])
    if packed and len(kernel) == 2:
        w_shape = (w.shape[1], w.shape[0] // (kernel[0] * kernel[1]), *kernel)
    else:
        w_shape = tuple(w.shape)
    ok = len(kernel) == 2 and im2col_ok(x.shape, w_shape, attrs)
    if not (plain and ok) or (residual is not None and residual.dtype != np.float32):
        if packed:  # packed weights with shapes they were not packed for: unpack them
            m, c = w.shape[1], x.shape[1]
            unpacked = w.T.reshape(m, c, *kernel)
            inputs = [x, unpacked, *inputs[2:]]
        return _clipped_fallback(conv_im2col, inputs, attrs)
    weights = w if packed else pack_columns(w)
    win = window.geometry(attrs, tuple(x.shape[2:]), kernel)
    n, depth, m = x.shape[0], weights.shape[0], weights.shape[1]
    ho, wo = win.out
    out = aligned_empty((n, ho, wo, m), np.float32)
    res = NO_RESIDUAL if residual is None else residual_rows(residual, (n, m, ho, wo))
    flags, bias = epilogue_flags(attrs, b, residual, m)
    step, pixels = block_rows(m), ho * wo
    for image in range(n):
        cols = _columns(x[image : image + 1], win, depth)
        rows = out[image].reshape(pixels, m)
        for start in range(0, pixels, step):
            stop = min(pixels, start + step)
            np.matmul(cols[:, start:stop].T, weights, out=rows[start:stop])
            part = res if residual is None else res[image * pixels + start : image * pixels + stop]
            epilogue(rows[start:stop], bias, part, flags)
    return [out.transpose(0, 3, 1, 2)]


def _columns(x: np.ndarray, win: window.Window, depth: int) -> np.ndarray:
    """One (1, C, H, W) image's columns as (K, pixels), rows in (channel, tap row, tap column)
    order, from exact windows of its stride phases (conv_im2col_phased's gather)."""
    c = x.shape[1]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    flat, hph, wph = _flat_phases(x, win)
    phases = flat.reshape(sh * sw, c, hph, wph)
    cols = scratch(PING, (depth, ho * wo), np.float32)
    taps = cols.reshape(c, kh * kw, ho, wo)
    for tap, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        r, q = i * dh // sh, j * dw // sw
        np.copyto(taps[:, tap], phases[(i * dh % sh) * sw + j * dw % sw, :, r : r + ho, q : q + wo])
    return cols


conv_im2col_jit.fuses_clip = True  # type: ignore[attr-defined]
conv_im2col_jit.jit = True  # type: ignore[attr-defined]
conv_im2col_jit.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_columns(inputs[1])}
    if attrs.get("kernel_shape") and im2col_ok(inputs[0].shape, inputs[1].shape, attrs)
    else {}
)


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return []
    return [conv_im2col_jit] if im2col_ok(shapes[0], shapes[1], attrs) else []


CANDIDATES = {"Conv": _conv_candidates}
