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

from typing import Any

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine import jit, team
from engine.ops.conv.common import clip_floats
from engine.ops.loop_ir import unrolled_range

LANES = 16  # float32 lanes of one LLVM vector (a zmm register, or two ymm where LLVM prefers)
NR = 2 * LANES  # output channels per panel (one tile's width)
MR = 6  # output rows (pixels) per tile: 12 accumulators + 2 weight vectors + a broadcast
UNROLL = 4  # K steps per loop iteration in the micro-kernels (loop_ir.unrolled_range)
# Input rows per block of tiles: a block's inputs stay in L2 while every panel streams past them.
BLOCK_INPUT_BYTES = 256 << 10
MIN_BLOCK_ROWS = 16 * MR


def _micro(widths: tuple[int, ...], rows: int = MR, unroll: int | None = None, prefetch: bool = False) -> Any:
    """The micro-kernel: for ``rows`` rows r (MR unless told) and columns c < sum(widths), in
    vectors of ``widths`` lanes (flat float32 arrays; element offsets and row strides):
    out[oo + r*os + c] = clip(sum_k x[xo + r*xs + k] * w[wo + k*ws + c] + bias[bo + c]
    (+ res[ro + r*rs + c] when has_res), lo, hi) (when has_clip); the loop over k runs
    ``unroll`` steps an iteration (default UNROLL), in order, so results do not depend on it.
    With ``prefetch``, a last argument pf: iteration i also prefetches the cache line of w at
    element pf + 16 i (the next work item's weights, while this one's tiles compute: see
    ``_gemm_items``)."""

    def typer(typingctx, x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi, *pf):  # noqa: ANN001, ANN202, ARG001
        sig = types.void(x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi, *pf)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            x_, xo_, xs_, w_, wo_, ws_, depth_, out_, oo_, os_, b_, bo_, r_, ro_, rs_, flags_, lo_, hi_ = (
                args[:18]
            )
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

            head = None
            if prefetch:
                line_floats = const(64 // 4)
                byte_ptr = ir.IntType(8).as_pointer()
                fetch_type = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
                fetch = cgutils.get_or_insert_function(builder.module, fetch_type, "llvm.prefetch.p0")

                def head(i: Any) -> None:  # a read, kept in every cache level, of data
                    at = builder.gep(wp, [builder.add(args[18], builder.mul(i, line_floats))])
                    flags = [ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
                    builder.call(fetch, [builder.bitcast(at, byte_ptr), *flags])

            unrolled_range(builder, depth_, step, UNROLL if unroll is None else unroll, head)
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

    if prefetch:

        def micro(
            typingctx, x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi, pf
        ):  # noqa: ANN001, ANN202, E501
            return typer(
                typingctx, x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi, pf
            )

    else:

        def micro(typingctx, x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi):  # noqa: ANN001, ANN202, E501
            return typer(
                typingctx, x, xo, xs, w, wo, ws, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi
            )

    return intrinsic(micro)


_micro_full = _micro((LANES, LANES), prefetch=True)  # 6 x 32
# 7 x 32 (14 accumulators of AVX-512's 32 registers): a block of n >= 35 rows is n % 6 of these
# and 6-row tiles for the rest, exactly; 49 pixels (7x7 layers) had cost as much as 54
SEVEN = MR + 1
_micro_full7 = _micro((LANES, LANES), SEVEN, prefetch=True)
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


@jit.njit([types.void(jit.array(types.float32, 3, "A", readonly=True), jit.array(types.float32, 4, "C"))])
def _pack_into(src, packed):  # noqa: ANN001, ANN202
    """``pack_panels`` of src (S, K, M), any strides, in one pass: per panel the K rows of its
    columns (packed's last axis: 32, or gemm8_jit's 16; zero past M), the zero row and the row
    holding M.  Along K when src's rows are contiguous, along the panel's columns otherwise
    (keys^T: a column of keys is one row of K)."""
    slots, depth, m = src.shape
    panels, width = packed.shape[1], packed.shape[3]
    for s in range(slots):
        for p in range(panels):
            j0 = p * width
            cols = min(width, m - j0)
            if src.strides[2] <= src.strides[1]:  # rows of src contiguous: read them in order
                for k in range(depth):
                    for j in range(cols):
                        packed[s, p, k, j] = src[s, k, j0 + j]
            else:
                for j in range(cols):
                    for k in range(depth):
                        packed[s, p, k, j] = src[s, k, j0 + j]
            for k in range(depth):
                for j in range(cols, width):
                    packed[s, p, k, j] = 0
            for j in range(width):
                packed[s, p, depth, j] = 0
                packed[s, p, depth + 1, j] = 0
            packed[s, p, depth + 1, 0] = m


def pack_slots(src: np.ndarray, width: int = NR) -> np.ndarray:
    """``pack_panels`` of a float32 (S, K, M) view of any strides (attention's keys^T and values
    per head) with one pass over it, where ``pack_panels`` made four over zeroed copies; ``width``
    16: gemm8_jit's ``pack_panels16``."""
    slots, depth, m = src.shape
    packed = np.empty((slots, -(-m // width), depth + 2, width), np.float32)
    _pack_into(src, packed)
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
    panel_floats = (depth + 2) * NR
    fetched = (depth // UNROLL) * 16  # floats of weights one full tile prefetches (a line an iteration)
    for item in range(first, last):
        s, rest = item // per_slot, item % per_slot
        p0, panel = (rest // panels) * block_rows, rest % panels
        p1 = min(rows, p0 + block_rows)
        xs, os = s * rows * depth, s * rows * m
        j0 = panel * NR
        cols = min(NR, m - j0)
        wo = (s * panels + panel) * panel_floats
        # the next item's weights, a slice per full tile while this item's tiles compute: a
        # panel read from memory (a big layer's, evicted since the last run) is then read while
        # the cores compute, not in a burst at the panel's first tile.  Only within [first,
        # last): a team's worker claims its chunks from the back, so the item after its chunk
        # is one it has done, and its next one is not known here
        after = item + 1
        ahead = ((after // per_slot) * panels + (after % per_slot) % panels) * panel_floats
        ahead_end = min(ahead + panel_floats, packed.size) if after < last else 0
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
        sevens = (p1 - start) % MR
        if cols == NR and sevens and p1 - start >= SEVEN * sevens:
            for _ in range(sevens):  # then 6-row tiles end exactly at p1
                at, ro, xo = os + start * m + j0, start * rstride + j0, xs + start * depth
                pf = ahead if ahead + fetched <= ahead_end else wo  # past it: this panel's own, cached
                _micro_full7(
                    x, xo, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                    flags, lo, hi, pf,
                )  # fmt: skip
                ahead += fetched
                start += SEVEN
        for t0 in range(start, p1, MR):
            count = min(MR, p1 - t0)
            if count < MR and p1 - MR >= p0 and not in_place:
                t0, count = p1 - MR, MR
            at, ro = os + t0 * m + j0, t0 * rstride + j0
            if count == MR and cols == NR:
                pf = ahead if ahead + fetched <= ahead_end else wo
                _micro_full(
                    x, xs + t0 * depth, depth, packed, wo, NR, depth, out, at, m, bias, j0, res, ro, rstride,
                    flags, lo, hi, pf,
                )  # fmt: skip
                ahead += fetched
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
    shared = team.worth_sharing(slots * rows * depth * m)
    team.run(team.GEMM32, _gemm_items, _gemm_parallel, *args, 0, items, shared=shared)


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
    flags = (residual is not None, *clip_floats(bounds))
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


def _plain(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, residual: np.ndarray | None) -> bool:
    """float32 throughout (the micro-kernel's only type)."""
    return (
        x.dtype == w.dtype == np.float32
        and (b is None or b.dtype == np.float32)
        and (residual is None or residual.dtype == np.float32)
    )


def _unpacked(packed: np.ndarray, kernel: tuple[int, ...]) -> np.ndarray:
    """``pack_panels``'s weights as (M, C, kh, kw) again, for a fallback (tap-major rows)."""
    depth, m = packed_shape(packed)
    wt = packed[:, :depth].transpose(1, 0, 2).reshape(depth, -1)[:, :m]
    taps = int(np.prod(kernel))
    return np.ascontiguousarray(wt.T.reshape(m, *kernel, depth // taps).transpose(0, 3, 1, 2))


# gemm's 16-wide (AVX2) panels: gemm8_jit imports this module's micro-kernel, hence last
from engine.ops.conv import gemm8_jit  # noqa: E402
