"""Conv as an implicit GEMM on the register-tiled micro-kernel (numba + LLVM IR): no im2col.

gemm_jit.py's conv kernels gather im2col columns first (one write and one read of K floats per
output pixel: 1.35 MB for MobileNetV2's 3-channel stem), then run the GEMM over them.  Here the
micro-kernel reads its inputs straight from a zero-padded copy of the image: the k-th input of
output pixel r is x[base + r * xs + offsets[k]], offsets a table of the K (channel, tap)
positions, so a 6 x 32 output tile (twelve 16-lane accumulators) is built from the image as it
lies.  Two layouts:

- ``conv_direct_jit``: NCHW padded copy, K in the weights' own (channel, i, j) order -- for few
  input channels (a stem), where a channels-last copy would be runs of 3 floats;
- ``conv_direct_jit_hwc``: channels-last padded copy, K tap-major (i, j, channel), the order
  of gemm_conv_jit.pack_columns.  Not a search candidate: on ResNet18's 3x3 layers it took twice
  im2col_gemm's time (whose GEMM reads each tile's inputs as contiguous rows); kept, tested,
  for the next try (blocks of K did not change that).

Weights are packed once per plan into 32-channel panels (gemm_jit.pack_panels); bias, residual
and Relu / Clip are applied to each tile in registers and the result is left channels last.
Sums run over K in order with fused multiply-adds, then bias, then residual: results differ
from numpy's (OpenBLAS's blocked sums) by float32 rounding only.
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
    PONG,
    _clipped_fallback,
    aligned_empty,
    clip_floats,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.gemm_conv_jit import pack_columns
from engine.ops.conv.gemm_jit import (
    LANES,
    MR,
    NR,
    UNROLL,
    _plain,
    _unpacked,
    address,
    pack_panels,
    packed_shape,
)
from engine.ops.conv.im2col import conv_im2col
from engine.ops.conv.pointwise_jit import residual_rows
from engine.ops.loop_ir import unrolled_range
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch

# Below this many input channels the NCHW form (its K runs along image rows); at and above it
# channels last (its K runs along a pixel's channels).
HWC_MIN_CHANNELS = 16


def _micro(vectors: int) -> Any:
    """out[oo + r*os + v*16 + l] = clip(sum_k x[xo + r*xs + offs[k]] * w[wo + k*32 + v*16 + l]
    + bias[bo + v*16 + l] (+ res[ro + r*rs + v*16 + l]), lo, hi) for the MR rows r and
    ``vectors`` 16-lane columns v (flat arrays and element offsets)."""

    @intrinsic
    def micro(typingctx, x, xo, xs, offs, w, wo, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi):  # noqa: ANN001, ANN202, ARG001
        sig = types.void(x, xo, xs, offs, w, wo, depth, out, oo, os, bias, bo, res, ro, rs, flags, lo, hi)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            x_, xo_, xs_, offs_, w_, wo_, depth_, out_, oo_, os_, b_, bo_, r_, ro_, rs_, flags_, lo_, hi_ = (
                args
            )
            xp, kp, wp, op, bp, rp = (
                context.make_array(signature.args[i])(context, builder, value).data
                for i, value in ((0, x_), (3, offs_), (4, w_), (7, out_), (10, b_), (12, r_))
            )
            i32, i64 = ir.IntType(32), ir.IntType(64)
            vec = ir.VectorType(ir.FloatType(), LANES)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]), "llvm.fma.v16f32"
            )
            undef = ir.Constant(vec, ir.Undefined)
            splat_mask = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)

            def vector_at(base: Any, offset: Any) -> Any:
                return builder.bitcast(builder.gep(base, [offset]), vec.as_pointer())

            def const(value: int) -> Any:
                return ir.Constant(i64, value)

            def splat(value: Any) -> Any:
                return builder.shuffle_vector(
                    builder.insert_element(undef, value, ir.Constant(i32, 0)), undef, splat_mask
                )

            # accumulators in allocas: LLVM's mem2reg turns them into registers
            zero = ir.Constant(vec, None)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(vectors)] for _ in range(MR)]
            rows = [builder.add(xo_, builder.mul(const(r), xs_)) for r in range(MR)]

            def step(k: Any) -> None:
                offset = builder.load(builder.gep(kp, [k]))
                wk = builder.add(wo_, builder.mul(k, const(NR)))
                weights = [
                    builder.load(vector_at(wp, builder.add(wk, const(v * LANES))), align=4)
                    for v in range(vectors)
                ]
                for r in range(MR):
                    a = splat(builder.load(builder.gep(xp, [builder.add(rows[r], offset)])))
                    for v in range(vectors):
                        builder.store(
                            builder.call(fma, [a, weights[v], builder.load(accs[r][v])]), accs[r][v]
                        )

            unrolled_range(builder, depth_, step, UNROLL)
            has_res = builder.trunc(builder.and_(flags_, const(1)), ir.IntType(1))
            has_clip = builder.trunc(builder.lshr(flags_, const(1)), ir.IntType(1))
            low, high = splat(lo_), splat(hi_)
            for v in range(vectors):
                b = builder.load(vector_at(bp, builder.add(bo_, const(v * LANES))), align=4)
                for r in range(MR):
                    slot = accs[r][v]
                    builder.store(builder.fadd(builder.load(slot), b), slot)
                    with builder.if_then(has_res):
                        at = builder.add(builder.add(ro_, builder.mul(const(r), rs_)), const(v * LANES))
                        builder.store(
                            builder.fadd(builder.load(slot), builder.load(vector_at(rp, at), align=4)), slot
                        )
                    with builder.if_then(has_clip):
                        # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                        value = builder.load(slot)
                        value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
                        value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
                        builder.store(value, slot)
                    target = builder.add(builder.add(oo_, builder.mul(const(r), os_)), const(v * LANES))
                    builder.store(builder.load(slot), vector_at(op, target), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return micro


_micro_full = _micro(2)  # 6 x 32
_micro_half = _micro(1)  # 6 x 16

_FLAT_IN = jit.array(types.float32, 1, "C", readonly=True)
_I64 = types.int64
# padded input (flat, with slack), offsets (K), packed weights (flat), out (flat, channels last),
# bias padded to whole panels, residual (flat, channels last); flags, clip bounds; then Ho, Wo,
# M, K, elements per image, per output row and per output pixel of the padded input, and the
# output rows [first, last) (index = image * Ho + row)
_ROWS = types.void(
    _FLAT_IN,
    jit.array(types.int64, 1, "C", readonly=True),
    _FLAT_IN,
    jit.array(types.float32, 1, "C"),
    _FLAT_IN,
    _FLAT_IN,
    types.boolean,
    types.boolean,
    types.float32,
    types.float32,
    types.boolean,
    *(_I64,) * 9,
)


@jit.njit([_ROWS])
def _rows(
    x,
    offs,
    packed,
    out,
    bias,
    res,
    has_res,
    has_clip,
    lo,
    hi,
    split,
    ho,
    wo,
    m,
    depth,
    image,
    line,
    step,
    first,
    last,
):  # noqa: ANN001, ANN202
    """Output rows [first, last): per row, panel of 32 channels and tile of MR pixels, one
    micro-kernel call (two 6 x 16 ones when ``split``: twelve accumulators, where 6 x 32 in
    16-lane vectors spills the 16 ymm registers of an AVX2 core); a row's last pixels and a
    panel's last channels through a tile in scratch.  Called for all rows (one thread) or per
    row by ``_rows_parallel``."""
    panels = (m + NR - 1) // NR
    flags = (1 if has_res else 0) | (2 if has_clip else 0)
    tile = np.empty(MR * NR, np.float32)
    # a row's last few pixels are computed as a whole tile ending at its last pixel (pixels
    # before them computed twice, the same values stored again), as gemm_jit's last rows
    rp, op = res.ctypes.data, out.ctypes.data
    in_place = has_res and rp < op + 4 * out.size and op < rp + 4 * res.size
    for index in range(first, last):
        n, oh = index // ho, index % ho
        base = n * image + oh * line
        for panel in range(panels):
            j0 = panel * NR
            cols = min(NR, m - j0)
            wo_at = panel * (depth + 2) * NR
            for t0 in range(0, wo, MR):
                count = min(MR, wo - t0)
                if count < MR and wo >= MR and not in_place:
                    t0, count = wo - MR, MR
                xo = base + t0 * step
                at = (index * wo + t0) * m + j0
                if count == MR and cols == NR and not split:
                    _micro_full(
                        x,
                        xo,
                        step,
                        offs,
                        packed,
                        wo_at,
                        depth,
                        out,
                        at,
                        m,
                        bias,
                        j0,
                        res,
                        at,
                        m,
                        flags,
                        lo,
                        hi,
                    )
                    continue
                for half in range(0, cols, LANES):
                    width = min(LANES, cols - half)
                    if count == MR and width == LANES:
                        _micro_half(
                            x, xo, step, offs, packed, wo_at + half, depth, out, at + half, m, bias,
                            j0 + half, res, at + half, m, flags, lo, hi,
                        )  # fmt: skip
                        continue
                    # past the row's end the tile reads the next row's inputs (or the slack
                    # after the image): rows it computes and drops
                    _micro_half(
                        x,
                        xo,
                        step,
                        offs,
                        packed,
                        wo_at + half,
                        depth,
                        tile,
                        0,
                        NR,
                        bias,
                        j0 + half,
                        res,
                        0,
                        0,
                        0,
                        lo,
                        hi,
                    )
                    for r in range(count):
                        for j in range(width):
                            value = tile[r * NR + j]
                            place = at + r * m + half + j
                            if has_res:
                                value += res[place]
                            if has_clip:  # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                                value = lo if value < lo else (hi if value > hi else value)
                            out[place] = value


@jit.njit([_ROWS], parallel=True)
def _rows_parallel(
    x,
    offs,
    packed,
    out,
    bias,
    res,
    has_res,
    has_clip,
    lo,
    hi,
    split,
    ho,
    wo,
    m,
    depth,
    image,
    line,
    step,
    first,
    last,
):  # noqa: ANN001, ANN202
    for index in prange(first, last):
        _rows(
            x,
            offs,
            packed,
            out,
            bias,
            res,
            has_res,
            has_clip,
            lo,
            hi,
            split,
            ho,
            wo,
            m,
            depth,
            image,
            line,
            step,
            index,
            index + 1,
        )


_NO_RESIDUAL = np.zeros(1, np.float32)


def pack_nchw(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights -> panels of the (C*kh*kw, M) right-hand side, (c, i, j) rows."""
    return pack_panels(w.reshape(w.shape[0], -1).T)


def _padded(x: np.ndarray, win: window.Window, channels_last: bool, slack: int) -> np.ndarray:
    """The zero-padded image, (N, C, Hp, Wp) or (N, Hp, Wp, C), flat with ``slack`` zeros after
    it (a tile's dropped rows may read past the last image); only the padding is zeroed."""
    n, c, height, width = x.shape
    (pt, pl), (pb, pr) = win.pads_begin, win.pads_end
    hp, wp = height + pt + pb, width + pl + pr
    flat = scratch(PONG, (n * c * hp * wp + slack,), np.float32)
    flat[n * c * hp * wp :] = 0
    image = flat[: n * c * hp * wp].reshape((n, hp, wp, c) if channels_last else (n, c, hp, wp))
    # as (N, C, Hp, Wp) either way (a transposed view when channels last)
    planes = image.transpose(0, 3, 1, 2) if channels_last else image
    planes[:, :, :pt] = 0
    planes[:, :, pt + height :] = 0
    planes[:, :, pt : pt + height, :pl] = 0
    planes[:, :, pt : pt + height, pl + width :] = 0
    np.copyto(planes[:, :, pt : pt + height, pl : pl + width], x)
    return flat


def _direct(
    inputs: list[np.ndarray | None], attrs: dict[str, Any], channels_last: bool, split: bool = False
) -> list[np.ndarray]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    packed = w.ndim == 3
    kernel = tuple(attrs.get("kernel_shape") or ()) if packed else tuple(w.shape[2:])
    ok = len(kernel) == 2 and x.ndim == 4 and _plain(x, w, b, residual) and int(attrs.get("group", 1)) == 1
    if ok and packed:
        depth, m = packed_shape(w)
        ok = depth == x.shape[1] * kernel[0] * kernel[1]
    elif ok:
        ok = w.shape[1] == x.shape[1]
        m = w.shape[0]
    if not ok:
        if packed and len(kernel) == 2:
            unpacked = _unpacked(w, kernel)
            if not channels_last:  # _unpacked reads tap-major rows; these are (c, i, j)
                depth, m = packed_shape(w)
                wt = w[:, :depth].transpose(1, 0, 2).reshape(depth, -1)[:, :m]
                unpacked = np.ascontiguousarray(wt.T.reshape(m, -1, *kernel))
            inputs = [x, unpacked, *inputs[2:]]
        return _clipped_fallback(conv_im2col, inputs, attrs)
    weights = w if packed else (pack_columns(w) if channels_last else pack_nchw(w))
    win = window.geometry(attrs, tuple(x.shape[2:]), kernel)
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    hp, wp = (
        x.shape[2] + win.pads_begin[0] + win.pads_end[0],
        x.shape[3] + win.pads_begin[1] + win.pads_end[1],
    )
    if channels_last:
        taps = (np.arange(kh)[:, None] * dh * wp + np.arange(kw)[None, :] * dw).reshape(-1)
        offs = (taps[:, None] * c + np.arange(c)[None, :]).reshape(-1)
        image, line, step = hp * wp * c, sh * wp * c, sw * c
    else:
        taps = (np.arange(kh)[:, None] * dh * wp + np.arange(kw)[None, :] * dw).reshape(-1)
        offs = (np.arange(c)[:, None] * hp * wp + taps[None, :]).reshape(-1)
        image, line, step = c * hp * wp, sh * wp, sw
    slack = MR * step + int(offs.max()) + 1
    xp = _padded(x, win, channels_last, slack)
    out = aligned_empty((n, ho, wo, m), np.float32, address)
    bias = np.zeros(weights.shape[0] * NR, np.float32)  # whole panels: the tiles read 16 lanes
    if b is not None:
        bias[:m] = b
    res = _NO_RESIDUAL if residual is None else residual_rows(residual, (n, m, ho, wo)).reshape(-1)
    flags = (residual is not None, *clip_floats(fused_bounds(attrs)), split)
    geometry = (ho, wo, m, offs.size, image, line, step)
    args = (xp, offs.astype(np.int64), weights.reshape(-1), out.reshape(-1), bias, res, *flags, *geometry)
    shared = team.worth_sharing(n * ho * wo * m * offs.size)  # by output rows, as the depthwise conv
    team.run(team.DIRECT, _rows, _rows_parallel, *args, 0, n * ho, shared=shared)
    return [out.transpose(0, 3, 1, 2)]


def conv_direct_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """2-D conv of one group as an implicit GEMM over an NCHW zero-padded copy (few channels:
    a stem), its result channels last; bias, residual and a fused Relu / Clip (``fuses_clip``)
    per tile; input 1 may be pre-packed by ``pack_nchw`` (then ``kernel_shape`` must be given)."""
    return _direct(inputs, attrs, channels_last=False)


def conv_direct_jit8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """conv_direct_jit on 6 x 16 tiles (AVX2: twelve ymm accumulators), weights as packed for it."""
    return _direct(inputs, attrs, channels_last=False, split=True)


def conv_direct_jit_hwc(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The same over a channels-last padded copy, K tap-major (many channels); input 1 may be
    pre-packed by gemm_conv_jit.pack_columns."""
    return _direct(inputs, attrs, channels_last=True)


def direct_ok(x_shape: Sequence[int], w_shape: Sequence[int], attrs: dict[str, Any]) -> bool:
    """A 2-D conv of one group with a kernel larger than 1x1 (1x1 convs go to gemm_jit)."""
    return (
        len(x_shape) == 4
        and len(w_shape) == 4
        and int(attrs.get("group", 1)) == 1
        and x_shape[1] == w_shape[1]
        and tuple(w_shape[2:]) != (1, 1)
    )


for _kernel, _pack in (
    (conv_direct_jit, pack_nchw),
    (conv_direct_jit8, pack_nchw),
    (conv_direct_jit_hwc, pack_columns),
):
    _kernel.fuses_clip = True  # type: ignore[attr-defined]
    _kernel.jit = True  # type: ignore[attr-defined]
    _kernel.pack = lambda inputs, attrs, pack=_pack: (  # type: ignore[attr-defined]
        {1: pack(inputs[1])}
        if attrs.get("kernel_shape") and direct_ok(inputs[0].shape, inputs[1].shape, attrs)
        else {}
    )


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if (
        len(shapes) < 2
        or shapes[0] is None
        or shapes[1] is None
        or not direct_ok(shapes[0], shapes[1], attrs)
    ):
        return []
    # channels last it lost to im2col_gemm's gathered columns on every 3x3 layer of ResNet18 (its
    # search, in the model: 1.22-2.98 ms against 0.44-1.55), so only the NCHW form is offered
    return [conv_direct_jit, conv_direct_jit8] if shapes[0][1] < HWC_MIN_CHANNELS else []


CANDIDATES = {"Conv": _conv_candidates}
