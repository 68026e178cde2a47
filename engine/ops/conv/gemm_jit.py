"""Conv as a JIT GEMM over pre-packed weights: a register-tiled micro-kernel (numba + LLVM IR).

numba's loop vectoriser keeps a GEMM's accumulators in memory (a store per multiply-add) and its
SLP vectoriser leaves a scalar-tiled kernel scalar, so the micro-kernel here is written as LLVM
IR (``numba.extending.intrinsic``): a 6 x 32 output tile lives in twelve 16-lane registers while
the loop over K broadcasts one input per row and loads two weight vectors, fused multiply-adds
only (~55 GFMA/s on one Zen 4 core, OpenBLAS 35-45 on MobileNetV2's 1x1 shapes).  The weights
are packed once per plan into panels of 32 output channels, (panels, K, 32), the bias in a row
under each panel, so no call re-packs them as OpenBLAS does; bias, residual and Relu / Clip
are applied to each tile while it is in L1.  A panel of only 8, 16 or 24 channels (narrow
projections) runs 12-row tiles instead, so it still has enough accumulators in flight.

Sums run over K in order with fused multiply-adds, then the bias, then the residual: results
differ from numpy's (OpenBLAS's blocked sums, then the bias) by float32 rounding only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

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
from engine.ops.conv.im2col import HWC_MIN_CHANNELS, conv_im2col, hwc_ok, pack_im2col_hwc
from engine.ops.conv.pointwise_jit import _pixels, _strides, pointwise_ok, residual_rows
from engine.ops.loop_ir import unrolled_range
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch

LANES = 16  # float32 lanes of one LLVM vector (a zmm register, or two ymm where LLVM prefers)
NR = 2 * LANES  # output channels per panel (one tile's width)
MR = 6  # output rows (pixels) per tile: 12 accumulators + 2 weight vectors + a broadcast
UNROLL = 4  # K steps per loop iteration in the micro-kernels (loop_ir.unrolled_range)
# Input rows per block of tiles: a block's inputs stay in L2 while every panel streams past them.
BLOCK_INPUT_BYTES = 256 << 10
MIN_BLOCK_ROWS = 16 * MR


def _micro(widths: tuple[int, ...], rows: int = MR, unroll: int | None = None) -> Any:
    """The micro-kernel: for ``rows`` rows r (MR unless told) and columns c < sum(widths), in
    vectors of ``widths`` lanes (flat float32 arrays; element offsets and row strides):
    out[oo + r*os + c] = clip(sum_k x[xo + r*xs + k] * w[wo + k*ws + c] + bias[bo + c]
    (+ res[ro + r*rs + c] when has_res), lo, hi) (when has_clip); the loop over k runs
    ``unroll`` steps an iteration (default UNROLL), in order, so results do not depend on it."""

    @intrinsic
    def micro(typingctx, x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi):  # noqa: ANN001, ANN202, ARG001
        sig = types.void(x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            x_, xo_, xs_, w_, wo_, ws_, depth_, out_, oo_, os_, b_, bo_, r_, ro_, rs_, flags_, lo_, hi_ = args
            xp, wp, op, bp, rp = (
                context.make_array(signature.args[i])(context, builder, value).data
                for i, value in ((0, x_), (3, w_), (7, out_), (10, b_), (12, r_))
            )
            i32, i64 = ir.IntType(32), ir.IntType(64)
            vecs = [ir.VectorType(ir.FloatType(), lanes) for lanes in widths]
            fmas = [
                cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{vec.count}f32"
                )
                for vec in vecs
            ]
            firsts = [sum(widths[:v]) for v in range(len(widths))]  # each vector's first column

            def vector_at(base: Any, offset: Any, v: int) -> Any:
                return builder.bitcast(builder.gep(base, [offset]), vecs[v].as_pointer())

            def const(value: int) -> Any:
                return ir.Constant(i64, value)

            def splat(value: Any, v: int) -> Any:
                undef = ir.Constant(vecs[v], ir.Undefined)
                mask = ir.Constant(ir.VectorType(i32, widths[v]), [0] * widths[v])
                return builder.shuffle_vector(
                    builder.insert_element(undef, value, ir.Constant(i32, 0)), undef, mask
                )

            # accumulators in allocas: LLVM's mem2reg turns them into registers
            accs = [
                [cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for vec in vecs]
                for _ in range(rows)
            ]
            starts = [builder.add(xo_, builder.mul(const(r), xs_)) for r in range(rows)]

            def step(k: Any) -> None:
                wk = builder.add(wo_, builder.mul(k, ws_))
                weights = [
                    builder.load(vector_at(wp, builder.add(wk, const(firsts[v])), v), align=4)
                    for v in range(len(widths))
                ]
                for r in range(rows):
                    scalar = builder.load(builder.gep(xp, [builder.add(starts[r], k)]))
                    for v in range(len(widths)):
                        a = splat(scalar, v)
                        builder.store(
                            builder.call(fmas[v], [a, weights[v], builder.load(accs[r][v])]), accs[r][v]
                        )

            unrolled_range(builder, depth_, step, UNROLL if unroll is None else unroll)
            has_res = builder.trunc(builder.and_(flags_, const(1)), ir.IntType(1))
            has_clip = builder.trunc(builder.lshr(flags_, const(1)), ir.IntType(1))
            for v in range(len(widths)):
                low, high = splat(lo_, v), splat(hi_, v)
                b = builder.load(vector_at(bp, builder.add(bo_, const(firsts[v])), v), align=4)
                for r in range(rows):
                    slot = accs[r][v]
                    builder.store(builder.fadd(builder.load(slot), b), slot)
                    with builder.if_then(has_res):
                        at = builder.add(builder.add(ro_, builder.mul(const(r), rs_)), const(firsts[v]))
                        builder.store(
                            builder.fadd(builder.load(slot), builder.load(vector_at(rp, at, v), align=4)),
                            slot,
                        )
                    with builder.if_then(has_clip):
                        # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                        value = builder.load(slot)
                        value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
                        value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
                        builder.store(value, slot)
                    target = builder.add(builder.add(oo_, builder.mul(const(r), os_)), const(firsts[v]))
                    builder.store(builder.load(slot), vector_at(op, target, v), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return micro


_micro_full = _micro((LANES, LANES))  # 6 x 32
_micro_half = _micro((LANES,))  # 6 x 16: a panel's last 16 or fewer channels
# A panel of 8, 16 or 24 channels (MobileNetV2's 16- and 24-channel projections): twice the rows, so
# twelve accumulators keep both of a Zen 5 core's 512-bit FMA pipes busy where six did not
# (FMA latency 4 cycles x 2 pipes: eight chains at least).
TALL = 2 * MR
_micro_tall = _micro((LANES,), TALL)  # 12 x 16
_micro_tall8 = _micro((8,), TALL)  # 12 x 8
_micro_tall24 = _micro((LANES, 8), TALL)  # 12 x 24: 24 accumulators, one pass over the inputs


def pack_panels(wt: np.ndarray) -> np.ndarray:
    """(K, M) weights -> (panels, K + 2, 32) float32: each panel 32 output channels of the
    weights, zero-padded, then a zero row (the micro-kernel's bias: the node's bias is added in
    the tile's epilogue, as a plan may feed a bias that is not a constant), then a row whose
    first element is M (float32 is exact for any channel count).  (S, K, M): each of the S
    matrices so, stacked (``gemm_batched``'s slots)."""
    *lead, depth, m = wt.shape
    panels = -(-m // NR)
    packed = np.zeros((*lead, panels, depth + 2, NR), np.float32)
    padded = np.zeros((*lead, depth + 1, panels * NR), np.float32)
    padded[..., :depth, :m] = wt
    packed[..., : depth + 1, :] = np.swapaxes(padded.reshape(*lead, depth + 1, panels, NR), -3, -2)
    packed[..., depth + 1, 0] = m
    return packed


def packed_shape(packed: np.ndarray) -> tuple[int, int]:
    """(K, M) of ``pack_panels``'s result."""
    return packed.shape[1] - 2, int(packed[0, -1, 0])


NO_RESIDUAL = np.zeros(1, np.float32)
_FLAT_IN = jit.array(types.float32, 1, "C", readonly=True)
_I64 = types.int64
# Flat (slots * P * K) inputs, (slots * panels * (K + 2) * 32) packed weights, (slots * P * M)
# outputs, the bias padded to whole panels, a flat residual; flags, clip bounds; then P, K, M,
# the residual's row stride, rows per block and the work items [first, last).  Flat arrays and
# offsets: a reshape inside a kernel compiles numba's shape-error formatting (~1.3 s of CPU).
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
def _gemm_items(
    x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block_rows, first, last
):  # noqa: ANN001, ANN202
    """Work items [first, last) of out[s] = x[s] @ W[s] (+ bias, residual, clip) over every slot
    s (one for a conv, 16 or 36 for Winograd's slot products): item = (slot, block of rows,
    panel of 32 columns) in that order, each tile finished (bias, residual, clip) in registers.
    Called directly for all items (one thread), or per item by ``_gemm_parallel``: one compiled
    body for both, where a separate per-block function had to be compiled and then linked (and
    optimised again) into each caller."""
    panels = (m + NR - 1) // NR
    per_slot = ((rows + block_rows - 1) // block_rows) * panels
    flags = (1 if has_res else 0) | (2 if has_clip else 0)
    tile = np.empty(MR * NR, np.float32)
    tail = np.zeros(MR * depth, np.float32)
    # a block's last few rows are computed as a whole tile ending at its last row (rows before
    # them computed twice, the same values stored again) unless the output is also the
    # residual (an in-place add would add it twice): 49 pixels, MobileNetV2's 7x7 layers, were
    # 8 tiles and a 1-row remainder through scratch and a scalar copy
    rp, op = res.ctypes.data, out.ctypes.data
    in_place = has_res and rp < op + 4 * out.size and op < rp + 4 * res.size
    for item in range(first, last):
        s, rest = item // per_slot, item % per_slot
        p0, panel = (rest // panels) * block_rows, rest % panels
        p1 = min(rows, p0 + block_rows)
        xs, os = s * rows * depth, s * rows * m
        j0 = panel * NR
        cols = min(NR, m - j0)
        wo = (s * panels + panel) * (depth + 2) * NR
        start = p0
        if cols < NR and cols % 8 == 0:  # 8, 16 or 24 channels: TALL-row tiles, then 6-row ones
            while start + TALL <= p1:
                at, ro, xo = os + start * m + j0, start * rstride + j0, xs + start * depth
                if cols == LANES + 8:
                    _micro_tall24(
                        x, xo, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                        flags, lo, hi,
                    )  # fmt: skip
                elif cols == LANES:
                    _micro_tall(
                        x, xo, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                        flags, lo, hi,
                    )  # fmt: skip
                else:
                    _micro_tall8(
                        x, xo, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                        flags, lo, hi,
                    )  # fmt: skip
                start += TALL
        for t0 in range(start, p1, MR):
            count = min(MR, p1 - t0)
            if count < MR and p1 - MR >= p0 and not in_place:
                t0, count = p1 - MR, MR
            at, ro = os + t0 * m + j0, t0 * rstride + j0
            if count == MR and cols == NR:
                _micro_full(
                    x, xs + t0 * depth, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                    flags, lo, hi,
                )  # fmt: skip
                continue
            source, offset = x, xs + t0 * depth
            if count < MR:  # the last rows, copied so the tile reads no row past the input
                for i in range(count * depth):
                    tail[i] = x[offset + i]
                source, offset = tail, 0
            for half in range(0, cols, LANES):  # 16 channels at a time: less padding computed
                width = min(LANES, cols - half)
                w_at, b_at = wo + half, j0 + half
                if count == MR and width == LANES:
                    _micro_half(
                        source, offset, depth, packed, w_at, NR, depth, out, at + half, m, bias, b_at, res,
                        ro + half, rstride, flags, lo, hi,
                    )  # fmt: skip
                    continue
                _micro_half(
                    source, offset, depth, packed, w_at, NR, depth, tile, 0, NR, bias, b_at, res, 0, 0, 0,
                    lo, hi,
                )  # fmt: skip
                for r in range(count):
                    for j in range(width):
                        value = tile[r * NR + j]
                        if has_res:
                            value += res[(t0 + r) * rstride + b_at + j]
                        if has_clip:  # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                            value = lo if value < lo else (hi if value > hi else value)
                        out[os + (t0 + r) * m + b_at + j] = value


@jit.njit([_ITEMS], parallel=True)
def _gemm_parallel(
    x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block_rows, first, last
):  # noqa: ANN001, ANN202
    for item in prange(first, last):
        _gemm_items(
            x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block_rows, item,
            item + 1,
        )  # fmt: skip


@jit.njit([types.int64(jit.array(types.uint8, 1, "C"))])
def address(raw):  # noqa: ANN001, ANN201
    """A buffer's address (for aligned_empty: 0.1 us, ctypes' 0.8)."""
    return raw.ctypes.data


def _flat(a: np.ndarray) -> np.ndarray:
    """``a`` as one flat C-order view (a copy would lose what a kernel writes)."""
    if not a.flags.c_contiguous:
        raise ValueError("the JIT GEMM takes C-contiguous arrays")
    return a.reshape(-1)


def _run_gemm(
    x: np.ndarray,
    packed: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray,
    res: np.ndarray,
    rstride: int,
    flags: tuple,
    block: int,
) -> None:
    """Every work item of ``_gemm_items`` for x (S, P, K), packed (S, panels, K + 2, 32), out
    (S, P, M): on one thread, or spread over the session's threads."""
    slots, rows, depth = x.shape
    m = out.shape[2]
    items = slots * -(-rows // block) * packed.shape[1]
    args = (_flat(x), _flat(packed), _flat(out), bias, _flat(res), *flags, rows, depth, m, rstride, block)
    if not team.worth_sharing(slots * rows * depth * m):
        _gemm_items(*args, 0, items)
        return
    team.run(team.GEMM32, _gemm_items, _gemm_parallel, *args, 0, items)


def block_rows_for(rows: int, depth: int, parallel: bool) -> int:
    """Input rows per block: what fits BLOCK_INPUT_BYTES (at least MIN_BLOCK_ROWS), a multiple of
    MR; with threads, small enough that there are blocks for each."""
    fit = max(MIN_BLOCK_ROWS, BLOCK_INPUT_BYTES // max(1, 4 * depth))
    if parallel:
        fit = min(fit, max(MR, -(-rows // 4)))
    return balanced_block(rows, max(MR, fit // MR * MR), MR)


def balanced_block(rows: int, fit: int, tile: int) -> int:
    """Rows per block, at most ``fit`` (a multiple of ``tile``), for as few blocks as ``fit``
    allows, of sizes as even as whole tiles make them: a block's rows past its last whole tile
    cost a tile (computed overlapping the one before) or, in a block shorter than a tile, a pass
    through scratch.  196 rows by 96 were 96 + 96 + 4 (the 4 through scratch: 238 against 225
    us on a 576 -> 96 conv); now 72 + 72 + 52."""
    blocks = -(-rows // fit)
    return min(fit, -(-rows // (blocks * tile)) * tile)


def gemm(
    x: np.ndarray,
    packed: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    bounds: tuple[Any, Any] | None = None,
) -> None:
    """out (P, M) = clip(x (P, K) @ W + bias + residual) with ``packed`` from ``pack_panels``;
    x, out and residual C-contiguous float32, bias (M,)."""
    if packed.shape[-1] != NR:  # gemm8_jit's 16-wide panels (conv_im2col_gemm8's)
        return gemm8_jit.gemm16(x, packed, out, bias, residual, bounds)
    low, high = (None, None) if bounds is None else bounds
    flags = (
        residual is not None,
        bounds is not None,
        np.float32(-np.inf if low is None else low),
        np.float32(np.inf if high is None else high),
    )
    res = NO_RESIDUAL if residual is None else residual
    m = out.shape[1]
    vector = np.zeros(packed.shape[0] * NR, np.float32)  # whole panels: the tiles read 16 lanes
    if bias is not None:
        vector[:m] = bias
    parallel = jit.threads() > 1 and x.shape[0] * packed.shape[0] >= 2 * MR
    block = block_rows_for(x.shape[0], x.shape[1], parallel)
    rstride = 0 if residual is None else residual.shape[1]
    _run_gemm(x[None], packed[None], out[None], vector, res, rstride, flags, block)


def gemm_batched(x: np.ndarray, packed: np.ndarray, out: np.ndarray) -> None:
    """out[s] = x[s] @ W[s] for every s: x (S, P, K), packed (S, ...) of ``pack_panels`` results
    stacked, out (S, P, M), all C-contiguous float32 (Winograd's slot products)."""
    bias = np.zeros(packed.shape[1] * NR, np.float32)
    block = block_rows_for(x.shape[1], x.shape[2], jit.threads() > 1)
    free = np.float32(0)
    _run_gemm(x, packed, out, bias, NO_RESIDUAL, 0, (False, False, free, free), block)


# -- Conv kernels on the GEMM ------------------------------------------------------------------


def _plain(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, residual: np.ndarray | None) -> bool:
    """float32 throughout (the micro-kernel's only type)."""
    return (
        x.dtype == w.dtype == np.float32
        and (b is None or b.dtype == np.float32)
        and (residual is None or residual.dtype == np.float32)
    )


def pack_pointwise(w: np.ndarray) -> np.ndarray:
    """(M, C, 1, 1) weights -> panels of the (C, M) right-hand side."""
    return pack_panels(w.reshape(w.shape[0], w.shape[1]).T)


def _unpacked(packed: np.ndarray, kernel: tuple[int, ...]) -> np.ndarray:
    """``pack_panels``'s weights as (M, C, kh, kw) again, for a fallback (tap-major rows)."""
    depth, m = packed_shape(packed)
    wt = packed[:, :depth].transpose(1, 0, 2).reshape(depth, -1)[:, :m]
    taps = int(np.prod(kernel))
    return np.ascontiguousarray(wt.T.reshape(m, *kernel, depth // taps).transpose(0, 3, 1, 2))


def _pointwise_setup(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]
) -> tuple | None:
    """What conv_1x1_gemm derives from the node's constants: packed weights, the bias over whole
    panels, clip flags, strides and output shape; None when the node is not for the kernel."""
    packed = w.ndim == 3
    shape_w = (packed_shape(w)[1], packed_shape(w)[0], 1, 1) if packed else w.shape
    if not (_plain(x, w, b, None) and pointwise_ok(x.shape, shape_w, attrs)):
        return None
    weights = w if packed else pack_pointwise(w)
    n, c, height, width = x.shape
    (sh, sw), m = _strides(attrs), shape_w[0]
    vector = np.zeros(weights.shape[0] * NR, np.float32)  # whole panels: the tiles read 16 lanes
    if b is not None:
        vector[:m] = b
    bounds = fused_bounds(attrs)
    low, high = (None, None) if bounds is None else bounds
    clip = (
        bounds is not None,
        np.float32(-np.inf if low is None else low),
        np.float32(np.inf if high is None else high),
    )
    ho, wo = (height - 1) // sh + 1, (width - 1) // sw + 1
    rows = n * ho * wo
    blocks = (block_rows_for(rows, c, False), block_rows_for(rows, c, True))  # one thread, several
    items = tuple(-(-rows // block) * weights.shape[0] for block in blocks)
    return weights.reshape(-1), vector, clip, (sh, sw), (n, ho, wo, m), blocks, items, rows * c * m


_POINTWISE = NodeMemo()


def conv_1x1_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv of float32 input as (pixels, C) @ (C, M) on the micro-kernel, its result channels
    last, bias, residual and a fused Relu / Clip (``fuses_clip``) applied per tile in registers;
    input 1 may be pre-packed by ``pack_pointwise``."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    found = _POINTWISE.get(attrs, (w, b), x, lambda: _pointwise_setup(x, w, b, attrs))
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
    if parallel:
        team.run(team.GEMM32, _gemm_items, _gemm_parallel, *args, *geometry)
    else:
        _gemm_items(*args, *geometry)
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

# the 8-lane (AVX2) 1x1 GEMM: it imports this module's micro-kernel, hence last
from engine.ops.conv import gemm8_jit  # noqa: E402
