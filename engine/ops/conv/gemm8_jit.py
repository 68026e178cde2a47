"""Conv on a JIT GEMM with 8-lane register tiles, for AVX2 cores (16 ymm registers): 1x1 convs,
and gemm_jit's channels-last im2col convs and Winograd slot products (winograd_jit.py) on it.

gemm_jit.py's micro-kernel keeps a 6 x 32 tile in twelve 16-lane vectors: one zmm register each
on AVX-512, but two ymm each on an AVX2 core (Zen 3), so its 24 accumulators spill past the 16
registers there.  This is the same micro-kernel (gemm_jit._micro, LLVM IR) on 6 x 16 tiles in
two 8-lane vectors per row: twelve ymm accumulators, two weight vectors and one broadcast, the
classic AVX2 shape.  Weights are packed at planning into panels of 16 output channels,
(panels, K + 2, 16), read contiguously (a 32-wide panel read half at a time strides past half of
each cache line); a last panel of 8 channels runs 12 x 8 tiles (twelve accumulators again).
Bias, residual and Relu / Clip are applied to each tile in registers, as in gemm_jit.

The kernel search measures this beside the others on every device: on AVX-512 it simply loses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit, team
from engine.ops.conv import gemm_conv_jit  # a module reference: it imports this one back
from engine.ops.conv.common import NodeMemo, _clipped_fallback, aligned_empty, residual_of
from engine.ops.conv.direct import conv_1x1
from engine.ops.conv.gemm_jit import (
    _flat,
    _micro,
    address,
    balanced_block,
)
from engine.ops.conv.im2col import hwc_ok, pack_im2col_hwc
from engine.ops.conv.pointwise_jit import Panels, _pixels, gemm_setup, pointwise_ok, residual_rows
from engine.ops.registry import Kernel

LANES = 8  # float32 lanes of one ymm register
NR = 2 * LANES  # output channels per panel
MR = 6  # rows per tile: 12 accumulators + 2 weight vectors + a broadcast = 15 of 16 registers
TALL = 2 * MR  # rows per tile of an 8-channel panel: 12 accumulators
# Input rows per block of tiles: a block's inputs stay in L2 while every panel streams past them.
BLOCK_INPUT_BYTES = 192 << 10
MIN_BLOCK_ROWS = 8 * TALL

_NO_RESIDUAL = np.zeros((1, 1), np.float32)
_micro16 = _micro((LANES, LANES))  # 6 x 16
_micro8 = _micro((LANES,), TALL)  # 12 x 8


def pack_panels16(wt: np.ndarray) -> np.ndarray:
    """(K, M) weights -> (panels, K + 2, 16) float32: each panel 16 output channels, zero-padded,
    a zero row, then a row whose first element is M (gemm_jit.pack_panels' layout, 16 wide)."""
    depth, m = wt.shape
    panels = -(-m // NR)
    padded = np.zeros((depth + 2, panels * NR), np.float32)
    padded[:depth, :m] = wt
    packed = np.ascontiguousarray(padded.reshape(depth + 2, panels, NR).transpose(1, 0, 2))
    packed[:, depth + 1, 0] = m
    return packed


def packed_shape16(packed: np.ndarray) -> tuple[int, int]:
    """(K, M) of ``pack_panels16``'s result."""
    return packed.shape[1] - 2, int(packed[0, -1, 0])


def pack_pointwise16(w: np.ndarray) -> np.ndarray:
    """(M, C, 1, 1) weights -> 16-wide panels of the (C, M) right-hand side."""
    return pack_panels16(w.reshape(w.shape[0], w.shape[1]).T)


_FLAT_IN = jit.array(types.float32, 1, "C", readonly=True)
_I64 = types.int64
# as gemm_jit._ITEMS, one slot: flat (P * K) inputs, packed panels, (P * M) output, the bias padded
# to whole panels, a flat residual; flags, clip bounds; P, K, M, the residual's row stride, rows
# per block and the work items [first, last)
_ITEMS = types.void(
    _FLAT_IN,
    _FLAT_IN,
    jit.array(types.float32, 1, "C"),
    _FLAT_IN,
    _FLAT_IN,
    types.boolean,
    types.boolean,
    types.float32,
    types.float32,
    *(_I64,) * 7,
)


@jit.njit([_ITEMS])
def _items16(
    x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block_rows, first, last
):  # noqa: ANN001, ANN202
    """Work items [first, last) of out[s] = x[s] @ W[s] (+ bias, residual, clip) over every slot
    s (one for a conv, 16 or 36 for Winograd's slot products): item = (slot, block of rows,
    panel of 16 columns).  A block's last rows are a whole tile ending at its last row (rows
    before them computed twice, the same values stored again) unless the output is also the
    residual; only a block shorter than a tile goes through scratch and a scalar copy."""
    panels = (m + NR - 1) // NR
    flags = (1 if has_res else 0) | (2 if has_clip else 0)
    tile = np.empty(TALL * NR, np.float32)
    tail = np.zeros(TALL * depth, np.float32)
    rp, op = res.ctypes.data, out.ctypes.data
    in_place = has_res and rp < op + 4 * out.size and op < rp + 4 * res.size
    per_slot = ((rows + block_rows - 1) // block_rows) * panels
    for item in range(first, last):
        s, rest = item // per_slot, item % per_slot
        p0, panel = (rest // panels) * block_rows, rest % panels
        p1 = min(rows, p0 + block_rows)
        j0 = panel * NR
        cols = min(NR, m - j0)
        wo = (s * panels + panel) * (depth + 2) * NR
        xs, os = s * rows * depth, s * rows * m
        height = MR if cols > LANES else TALL  # a panel of 8 or fewer channels: 12 x 8 tiles
        t0 = p0
        while t0 < p1:
            if t0 + height > p1:
                if in_place or p1 - height < p0:
                    break
                t0 = p1 - height
            at, ro = os + t0 * m + j0, t0 * rstride + j0
            if cols == NR:
                _micro16(
                    x, xs + t0 * depth, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                    flags, lo, hi,
                )  # fmt: skip
            elif cols == LANES:
                _micro8(
                    x, xs + t0 * depth, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                    flags, lo, hi,
                )  # fmt: skip
            else:
                break  # a ragged panel: every row below, through scratch
            t0 += height
        # the rest (a block shorter than a tile, a ragged panel): TALL rows at a time copied
        # into ``tail`` (so a tile reads no row past the input), computed into ``tile`` with the
        # bias, residual and clip added per element on the way out
        for start in range(t0, p1, TALL):
            count = min(TALL, p1 - start)
            tail[: count * depth] = x[xs + start * depth : xs + (start + count) * depth]
            tail[count * depth :] = 0
            for half in range(0, TALL, MR):
                _micro16(
                    tail, half * depth, depth, packed, wo, NR, depth, tile, half * NR, NR, bias, j0, res,
                    0, 0, 0, lo, hi,
                )  # fmt: skip
            for r in range(count):
                for j in range(cols):
                    value = tile[r * NR + j]
                    if has_res:
                        value += res[(start + r) * rstride + j0 + j]
                    if has_clip:  # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                        value = lo if value < lo else (hi if value > hi else value)
                    out[os + (start + r) * m + j0 + j] = value


@jit.njit([_ITEMS], parallel=True)
def _items16_parallel(
    x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block_rows, first, last
):  # noqa: ANN001, ANN202
    for item in prange(first, last):
        _items16(
            x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block_rows, item,
            item + 1,
        )  # fmt: skip


def block_rows16(rows: int, depth: int, parallel: bool) -> int:
    """Input rows per block: what fits BLOCK_INPUT_BYTES (at least MIN_BLOCK_ROWS), a multiple of
    TALL; with threads, small enough that there are blocks for each."""
    fit = max(MIN_BLOCK_ROWS, BLOCK_INPUT_BYTES // max(1, 4 * depth))
    if parallel:
        fit = min(fit, max(TALL, -(-rows // 4)))
    return balanced_block(rows, max(TALL, fit // TALL * TALL), TALL)


def gemm16(
    x: np.ndarray,
    packed: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    bounds: tuple[Any, Any] | None = None,
) -> None:
    """out (P, M) = clip(x (P, K) @ W + bias + residual) with ``packed`` from ``pack_panels16``
    (gemm_jit.gemm's contract); x, out and residual C-contiguous float32, bias (M,)."""
    rows, depth = x.shape
    m = out.shape[1]
    low, high = (-np.inf, np.inf) if bounds is None else bounds
    vector = np.zeros(packed.shape[0] * NR, np.float32)  # whole panels: the tiles read 16 lanes
    if bias is not None:
        vector[:m] = bias
    res = _NO_RESIDUAL if residual is None else residual
    parallel = team.worth_sharing(rows * depth * m)
    block = block_rows16(rows, depth, parallel)
    items = -(-rows // block) * packed.shape[0]
    args = (_flat(x), _flat(packed), _flat(out), vector, _flat(res), residual is not None, bounds is not None)
    geometry = (np.float32(low), np.float32(high), rows, depth, m, res.shape[1], block, 0, items)
    team.run(team.GEMM8, _items16, _items16_parallel, *args, *geometry, shared=parallel)


def gemm_batched16(x: np.ndarray, packed: np.ndarray, out: np.ndarray) -> None:
    """out[s] = x[s] @ W[s] for every s: x (S, P, K), packed (S, panels, K + 2, 16) of
    ``pack_panels16`` results stacked, out (S, P, M), all C-contiguous float32 (Winograd's slot
    products)."""
    slots, rows, depth = x.shape
    m = out.shape[2]
    bias = np.zeros(packed.shape[1] * NR, np.float32)
    parallel = team.worth_sharing(slots * rows * depth * m)
    block = block_rows16(rows, depth, parallel)
    items = slots * -(-rows // block) * packed.shape[1]
    free = np.float32(0)
    args = (_flat(x), _flat(packed), _flat(out), bias, _NO_RESIDUAL.reshape(-1), False, False, free, free)
    geometry = (rows, depth, m, 0, block, 0, items)
    team.run(team.GEMM8, _items16, _items16_parallel, *args, *geometry, shared=parallel)


_MEMO = NodeMemo()
_PANELS = Panels(NR, packed_shape16, pack_pointwise16, block_rows16)


def _unpacked16(packed: np.ndarray) -> np.ndarray:
    """``pack_pointwise16``'s weights as (M, C, 1, 1) again, for a fallback."""
    depth, m = packed_shape16(packed)
    wt = packed[:, :depth].transpose(1, 0, 2).reshape(depth, -1)[:, :m]
    return np.ascontiguousarray(wt.T.reshape(m, depth, 1, 1))


def conv_1x1_gemm8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv of float32 input as (pixels, C) @ (C, M) on 6 x 16 register tiles, its result
    channels last, bias, residual and a fused Relu / Clip (``fuses_clip``) per tile; input 1 may
    be pre-packed by ``pack_pointwise16``."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    found = _MEMO.get(attrs, (w, b), x, lambda: gemm_setup(x, w, b, attrs, _PANELS))
    if found is None or (residual is not None and residual.dtype != np.float32):
        if w.ndim == 3:  # a plan's packed weights with shapes it was not packed for: unpack them
            inputs = [x, _unpacked16(w), *inputs[2:]]
        return _clipped_fallback(conv_1x1, inputs, attrs)
    weights, vector, (has_clip, lo, hi), strides, shape, blocks, items, macs = found
    n, ho, wo, m = shape
    pixels = _pixels(x, strides)  # C-contiguous (N, Ho, Wo, C): flat below without a copy
    out = aligned_empty(shape, np.float32, address)
    res = residual_rows(residual, (n, m, ho, wo)) if residual is not None else _NO_RESIDUAL
    parallel = team.worth_sharing(macs)
    args = (
        pixels.reshape(-1),
        weights,
        out.reshape(-1),
        vector,
        res.reshape(-1),
        residual is not None,
        has_clip,
    )
    geometry = (lo, hi, n * ho * wo, pixels.shape[3], m, res.shape[-1], blocks[parallel], 0, items[parallel])
    team.run(team.GEMM8, _items16, _items16_parallel, *args, *geometry, shared=parallel)
    return [out.transpose(0, 3, 1, 2)]


conv_1x1_gemm8.fuses_clip = True  # type: ignore[attr-defined]
conv_1x1_gemm8.jit = True  # type: ignore[attr-defined]
conv_1x1_gemm8.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_pointwise16(inputs[1])} if pointwise_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


def pack_columns16(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights -> 16-wide panels of the (kh*kw*C, M) right-hand side, tap-major
    rows (gemm_conv_jit.pack_columns' order)."""
    return pack_panels16(pack_im2col_hwc(w).T)


def conv_im2col_gemm8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """gemm_conv_jit.conv_im2col_gemm on 6 x 16 tiles: its GEMM takes 16-wide panels to gemm16; input
    1 may be pre-packed by ``pack_columns16`` (then ``kernel_shape`` must be given)."""
    w = inputs[1]
    if w is not None and w.ndim == 4 and hwc_ok(inputs[0].shape, w.shape, attrs):
        inputs = [inputs[0], pack_columns16(w), *inputs[2:]]
        attrs = {**attrs, "kernel_shape": list(w.shape[2:])}
    return gemm_conv_jit.conv_im2col_gemm(inputs, attrs)


conv_im2col_gemm8.fuses_clip = True  # type: ignore[attr-defined]
conv_im2col_gemm8.jit = True  # type: ignore[attr-defined]
conv_im2col_gemm8.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_columns16(inputs[1])}
    if attrs.get("kernel_shape") and hwc_ok(inputs[0].shape, inputs[1].shape, attrs)
    else {}
)


def candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    """[conv_1x1_gemm8] for a plain 1x1 conv, [conv_im2col_gemm8] for a wider one of one group
    on enough channels (hwc_ok), else none."""
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return []
    x_shape, w_shape = shapes[0], shapes[1]
    if pointwise_ok(x_shape, w_shape, attrs):
        return [conv_1x1_gemm8]
    if hwc_ok(x_shape, w_shape, attrs) and len(w_shape) == 4 and x_shape[1] == w_shape[1]:
        return [conv_im2col_gemm8]
    return []
