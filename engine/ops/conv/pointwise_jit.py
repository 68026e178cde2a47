"""1x1 Conv channels last with a JIT epilogue (numba): the twin of direct.py's 1x1 GEMMs.

A 1x1 conv of a channels-last input is one GEMM, (pixels, C) @ (C, M), whose output is already
the channels-last result: no transposing copy in or out, so a chain of 1x1 and channels-last
depthwise convs (MobileNetV2's blocks) stays channels last from layer to layer.  numpy then
needs a pass for the bias, one for a residual and one for the Relu / Clip; here one JIT pass
does all three after the GEMM (per block of output rows on large images).  The GEMM stays
OpenBLAS's (a JIT 1x1 conv was 6x slower); the weights are pre-packed as the (C, M)
right-hand side.  Sums run bias, then residual, as the numpy kernels add them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.ops.conv.common import (
    PING,
    THIRD,
    _check_residual,
    _clipped_fallback,
    aligned_empty,
    clip_floats,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.direct import conv_1x1
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch

_F32, _BOOL = types.float32, types.boolean
_EPILOGUE = types.void(
    jit.array(_F32, 2, "C"),
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 2, "A", readonly=True),
    _BOOL,
    _BOOL,
    _BOOL,
    _F32,
    _F32,
)


@jit.njit([_EPILOGUE])
def _epilogue_serial(y, bias, res, has_bias, has_res, has_clip, lo, hi):  # noqa: ANN001, ANN202
    """y[p] = clip(y[p] + bias + res[p]) for every row p (pixel) of y, in place; clipping by
    comparisons, not min/max, so a NaN stays NaN as np.clip leaves it."""
    rows, m = y.shape
    if has_res and has_clip:
        for p in range(rows):
            for k in range(m):
                value = y[p, k] + bias[k] + res[p, k]
                y[p, k] = lo if value < lo else (hi if value > hi else value)
    elif has_res:
        for p in range(rows):
            for k in range(m):
                y[p, k] = y[p, k] + bias[k] + res[p, k]
    elif has_clip:
        for p in range(rows):
            for k in range(m):
                value = y[p, k] + bias[k]
                y[p, k] = lo if value < lo else (hi if value > hi else value)
    elif has_bias:
        for p in range(rows):
            for k in range(m):
                y[p, k] += bias[k]


@jit.njit([_EPILOGUE], parallel=True)
def _epilogue_parallel(y, bias, res, has_bias, has_res, has_clip, lo, hi):  # noqa: ANN001, ANN202
    rows = y.shape[0]
    chunk = max(1, (rows + 7) // 8)
    for part in prange((rows + chunk - 1) // chunk):
        start = part * chunk
        stop = min(rows, start + chunk)
        extra = res[start:stop] if has_res else res
        _epilogue_serial(y[start:stop], bias, extra, has_bias, has_res, has_clip, lo, hi)


NO_RESIDUAL = np.zeros((1, 1), np.float32)
# Output bytes per GEMM + epilogue block: bounds the work of one call on large images.  Smaller
# blocks, meant to keep the epilogue's rows in cache, measured slower (MobileNetV2's 112x112
# 16->96 conv: 0.96 ms in 256 KB blocks, 0.84 in 4 MB, the GEMM alone 0.68): each OpenBLAS call
# re-packs the weights.
BLOCK_BYTES = 4 << 20


def pointwise_ok(x_shape: Sequence[int], w_shape: Sequence[int], attrs: dict[str, Any]) -> bool:
    """A plain 2-D 1x1 conv: one group, no padding, no dilation effect (any stride)."""
    if len(x_shape) != 4 or len(w_shape) != 4 or tuple(w_shape[2:]) != (1, 1):
        return False
    return int(attrs.get("group", 1)) == 1 and x_shape[1] == w_shape[1] and _strides(attrs) is not None


def _strides(attrs: dict[str, Any]) -> tuple[int, int] | None:
    """A 1x1 conv's strides, or None when it pads.  Only explicit pads pad a 1x1 window: SAME
    needs (ceil(H/s) - 1) * s + 1 - H <= 0 cells (window.geometry in short, which costs a few
    us a call, 10% of a small layer's kernel time)."""
    if any(attrs.get("pads") or ()) and attrs.get("auto_pad", "NOTSET") == "NOTSET":
        return None
    strides = attrs.get("strides") or (1, 1)
    return (int(strides[0]), int(strides[1])) if len(strides) == 2 else None


def pack_pointwise(w: np.ndarray) -> np.ndarray:
    """(M, C, 1, 1) weights -> (C, M): the GEMM's right-hand side, contiguous."""
    return np.ascontiguousarray(w.reshape(w.shape[0], w.shape[1]).T)


def _pixels(x: np.ndarray, strides: tuple[int, int]) -> np.ndarray:
    """(N, C, H, W) -> its (N, Ho, Wo, C) pixels, C-contiguous: free for a channels-last input at
    stride 1, one gathering copy otherwise (whole channel runs when it is channels last)."""
    pixels = x[:, :, :: strides[0], :: strides[1]].transpose(0, 2, 3, 1)
    if pixels.flags.c_contiguous:
        return pixels
    gathered = scratch(PING, pixels.shape, np.float32)
    np.copyto(gathered, pixels)
    return gathered


def residual_rows(residual: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A FusedConv residual (N, M, H, W) as (N*H*W, M) rows: a view of a channels-last value,
    else a channels-last copy (a row-by-row read of NCHW would stride by H*W)."""
    _check_residual(residual, shape)
    n, m, height, width = shape
    rows = residual.transpose(0, 2, 3, 1)
    if not rows.flags.c_contiguous:
        copy = scratch(THIRD, (n, height, width, m), np.float32)
        np.copyto(copy, rows)
        rows = copy
    return rows.reshape(n * height * width, m)


@dataclass(frozen=True)
class Panels:
    """A register-tiled GEMM's weight layout, as its 1x1 conv kernel packs and blocks for it
    (gemm_conv_jit's 32-wide panels, gemm8_jit's 16-wide ones)."""

    width: int  # output channels per panel
    shape_of: Callable[[np.ndarray], tuple[int, int]]  # (K, M) of packed weights
    pack: Callable[[np.ndarray], np.ndarray]  # (M, C, 1, 1) weights -> panels
    block_rows: Callable[[int, int, bool], int]  # rows per block: (rows, depth, several threads)


def gemm_setup(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any], panels: Panels
) -> tuple | None:
    """What a 1x1 conv on a register-tiled GEMM derives from the node's constants: the packed
    weights (flat), the bias over whole panels, clip flags, strides, the output's channels-last
    shape, rows per block and work items (one thread, several) and its multiply-adds; None when
    the node is not for the kernel (float32 only: the micro-kernels' one type)."""
    packed = w.ndim == 3
    shape_w = (panels.shape_of(w)[1], panels.shape_of(w)[0], 1, 1) if packed else w.shape
    plain = x.dtype == w.dtype == np.float32 and (b is None or b.dtype == np.float32)
    if not (plain and pointwise_ok(x.shape, shape_w, attrs)):
        return None
    weights = w if packed else panels.pack(w)
    n, c, height, width = x.shape
    (sh, sw), m = _strides(attrs), shape_w[0]
    vector = np.zeros(weights.shape[0] * panels.width, np.float32)  # whole panels: tiles read them
    if b is not None:
        vector[:m] = b
    clip = clip_floats(fused_bounds(attrs))
    ho, wo = (height - 1) // sh + 1, (width - 1) // sw + 1
    rows = n * ho * wo
    blocks = (panels.block_rows(rows, c, False), panels.block_rows(rows, c, True))
    items = tuple(-(-rows // block) * weights.shape[0] for block in blocks)
    return weights.reshape(-1), vector, clip, (sh, sw), (n, ho, wo, m), blocks, items, rows * c * m


def conv_1x1_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv of float32 input as (pixels, C) @ (C, M) into a channels-last result, then bias,
    residual and a fused Relu / Clip (``fuses_clip``) in one JIT pass per block of rows; input 1
    may be pre-packed by ``pack_pointwise``."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    packed = w.ndim == 2
    shape_w = (w.shape[1], w.shape[0], 1, 1) if packed else w.shape
    plain = x.dtype == w.dtype == np.float32 and (b is None or b.dtype == np.float32)
    if not (plain and pointwise_ok(x.shape, shape_w, attrs)) or (
        residual is not None and residual.dtype != np.float32
    ):
        if packed:  # a plan's packed weights with shapes it was not packed for: unpack them
            inputs = [x, w.T.reshape(shape_w), *inputs[2:]]
        return _clipped_fallback(conv_1x1, inputs, attrs)
    weights = w if packed else pack_pointwise(w)
    n, c, height, width = x.shape
    (sh, sw), m = _strides(attrs), weights.shape[1]
    ho, wo = (height - 1) // sh + 1, (width - 1) // sw + 1
    pixels = _pixels(x, (sh, sw)).reshape(-1, c)
    out = aligned_empty((n, ho, wo, m), np.float32)
    rows = out.reshape(-1, m)
    res = NO_RESIDUAL if residual is None else residual_rows(residual, (n, m, ho, wo))
    flags, bias = epilogue_flags(attrs, b, residual, m)
    step, total = block_rows(m), rows.shape[0]
    if total <= step:  # one block (every layer of MobileNetV2)
        np.matmul(pixels, weights, out=rows)
        epilogue(rows, bias, res, flags)
        return [out.transpose(0, 3, 1, 2)]
    for start in range(0, total, step):
        stop = min(total, start + step)
        np.matmul(pixels[start:stop], weights, out=rows[start:stop])
        part = res if residual is None else res[start:stop]
        epilogue(rows[start:stop], bias, part, flags)
    return [out.transpose(0, 3, 1, 2)]


def block_rows(m: int) -> int:
    """Output rows per GEMM + epilogue block for M output channels."""
    return max(16, BLOCK_BYTES // (4 * m))


def epilogue_flags(
    attrs: dict[str, Any], b: np.ndarray | None, residual: np.ndarray | None, m: int
) -> tuple[tuple[Any, ...], np.ndarray]:
    """The epilogue's (has_bias, has_residual, has_clip, low, high) and its bias vector."""
    flags = (b is not None, residual is not None, *clip_floats(fused_bounds(attrs)))
    bias = np.zeros(m, np.float32) if b is None else np.ascontiguousarray(b, dtype=np.float32)
    return flags, bias


# Below this many elements the epilogue runs on one thread: waking the pool costs more than the
# pass (a 7x7x160 output is ~4 us of work).
PARALLEL_MIN_ELEMENTS = 1 << 16


def epilogue(rows: np.ndarray, bias: np.ndarray, res: np.ndarray, flags: tuple[Any, ...]) -> None:
    """Bias, residual rows and clip on the (pixels, M) block ``rows`` in place (JIT)."""
    if rows.size < PARALLEL_MIN_ELEMENTS:
        _epilogue_serial(rows, bias, res, *flags)
    else:
        jit.run(_epilogue_serial, _epilogue_parallel, rows, bias, res, *flags)


conv_1x1_jit.fuses_clip = True  # type: ignore[attr-defined]
conv_1x1_jit.jit = True  # type: ignore[attr-defined]
conv_1x1_jit.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_pointwise(inputs[1])} if pointwise_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return []
    return [conv_1x1_jit] if pointwise_ok(shapes[0], shapes[1], attrs) else []


CANDIDATES = {"Conv": _conv_candidates}
