"""Depthwise 3x3 Conv channels last with its taps in registers (numba + LLVM IR).

depthwise_jit.py's channels-last kernel leaves vectorising to LLVM's loop vectoriser, which
reloads the nine weights for every pixel and sends every border pixel (a quarter of a 7x7 or
14x14 image) through a scalar tap-by-tap loop: MobileNetV2's seventeen depthwise layers took
2.0 ms on one Zen 4 core against onnxruntime's 0.9.  Here the micro-kernel is written as LLVM IR
(as gemm_jit.py's GEMM): for one output row and a block of 16 channels, the nine weight vectors
and the bias stay in registers while the loop over the row's pixels loads nine input vectors,
sums them (a chain of fused multiply-adds per kernel row), adds bias (and residual), clips and stores once.
Border pixels take the same kernel with each tap's address switched to a zero vector where it
falls in the padding (a select, no branch), so no padded copy of the image is ever made.

Channels must be a multiple of 16 (MobileNet's 32...960 are); other shapes, kernel sizes and
dilations fall back to depthwise_jit's channels-last kernel.  Results differ from the numpy
kernels by float32 rounding only (fused multiply-adds, the rows summed apart).
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
from engine.ops.conv.common import NodeMemo, aligned_empty, residual_of
from engine.ops.conv.depthwise_jit import _arguments, conv_depthwise_jit_nhwc, depthwise_ok
from engine.ops.conv.gemm_jit import address
from engine.ops.registry import Kernel

LANES = 16  # float32 lanes of one LLVM vector (a zmm register, or two ymm)


def _micro(checked: bool) -> Any:
    """The row kernel: ``count`` output pixels of 16 channels from c0, pixel k's window at input
    column q0 + k*sw of the rows at element offsets r0..r2 of flat channels-last x (pixel
    stride ``cs`` elements).  ``checked``: a tap outside rows ``valid`` (bit i: row i is inside
    the image) or columns [0, width) reads zeros, as the padding would."""

    @intrinsic
    def micro(
        typingctx,
        x,
        r0,
        r1,
        r2,
        valid,
        cs,
        width,
        q0,
        sw,
        count,
        c0,
        w,
        bias,
        out,
        oo,
        res,
        ro,
        flags,
        lo,
        hi,
        zero,
    ):  # noqa: ANN001, ANN202, ARG001
        sig = types.void(
            x, r0, r1, r2, valid, cs, width, q0, sw, count, c0, w, bias, out, oo, res, ro, flags, lo, hi, zero
        )

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            x_, r0_, r1_, r2_, valid_, cs_, width_, q0_, sw_, count_, c0_ = args[:11]
            w_, bias_, out_, oo_, res_, ro_, flags_, lo_, hi_, zero_ = args[11:]
            xp, wp, bp, op, rp, zp = (
                context.make_array(signature.args[i])(context, builder, value).data
                for i, value in ((0, x_), (11, w_), (12, bias_), (13, out_), (15, res_), (20, zero_))
            )
            i1, i32, i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
            vec = ir.VectorType(ir.FloatType(), LANES)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]), "llvm.fma.v16f32"
            )
            undef = ir.Constant(vec, ir.Undefined)
            splat_mask = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)

            def const(value: int) -> Any:
                return ir.Constant(i64, value)

            def vector_at(base: Any, offset: Any) -> Any:
                return builder.bitcast(builder.gep(base, [offset]), vec.as_pointer())

            def splat(value: Any) -> Any:
                return builder.shuffle_vector(
                    builder.insert_element(undef, value, ir.Constant(i32, 0)), undef, splat_mask
                )

            weights = [
                builder.load(vector_at(wp, builder.add(builder.mul(const(t), cs_), c0_)), align=4)
                for t in range(9)
            ]
            b = builder.load(vector_at(bp, c0_), align=4)
            has_res = builder.trunc(builder.and_(flags_, const(1)), i1)
            has_clip = builder.trunc(builder.lshr(flags_, const(1)), i1)
            low, high = splat(lo_), splat(hi_)
            rows = [builder.add(r, c0_) for r in (r0_, r1_, r2_)]
            row_ok = [
                builder.icmp_unsigned("!=", builder.and_(valid_, const(1 << i)), const(0)) for i in range(3)
            ]
            zero_vec = builder.bitcast(zp, vec.as_pointer())
            slot = cgutils.alloca_once_value(builder, ir.Constant(vec, None))
            with cgutils.for_range(builder, count_) as loop:
                k = loop.index
                column = builder.add(q0_, builder.mul(k, sw_))
                products = {}
                for j in range(3):
                    cj = builder.add(column, const(j))
                    col_ok = builder.and_(
                        builder.icmp_signed(">=", cj, const(0)), builder.icmp_signed("<", cj, width_)
                    )
                    at = builder.mul(cj, cs_)
                    for i in range(3):
                        pointer = vector_at(xp, builder.add(rows[i], at))
                        if checked:
                            pointer = builder.select(builder.and_(row_ok[i], col_ok), pointer, zero_vec)
                        products[i, j] = (weights[i * 3 + j], builder.load(pointer, align=4))
                # one chain of fused multiply-adds per kernel row, then their sum: three short
                # dependency chains (the same speed as one chain of nine on Zen 4, which is
                # bound by the loads; kept for cores with fewer loads in flight)
                sums = []
                for i in range(3):
                    part = builder.fmul(*products[i, 0])
                    for j in (1, 2):
                        part = builder.call(fma, [*products[i, j], part])
                    sums.append(part)
                total = builder.fadd(builder.fadd(sums[0], sums[1]), sums[2])
                builder.store(builder.fadd(total, b), slot)
                target = builder.add(builder.add(oo_, builder.mul(k, cs_)), c0_)
                with builder.if_then(has_res):
                    extra = builder.add(builder.add(ro_, builder.mul(k, cs_)), c0_)
                    builder.store(
                        builder.fadd(builder.load(slot), builder.load(vector_at(rp, extra), align=4)), slot
                    )
                with builder.if_then(has_clip):
                    # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                    value = builder.load(slot)
                    value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
                    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
                    builder.store(value, slot)
                builder.store(builder.load(slot), vector_at(op, target), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return micro


_checked = _micro(True)
_inside = _micro(False)

_F32, _I64, _BOOL = types.float32, types.int64, types.boolean
_FLAT_IN = jit.array(_F32, 1, "C", readonly=True)
# flat channels-last x, taps (9 * C), bias, out, residual (flat, out's layout), zeros; flags and
# clip bounds; N, H, W, C, Ho, Wo, strides, pads; then the output rows [first, last)
_ROWS = types.void(
    _FLAT_IN,
    _FLAT_IN,
    _FLAT_IN,
    jit.array(_F32, 1, "C"),
    _FLAT_IN,
    _FLAT_IN,
    _BOOL,
    _BOOL,
    _F32,
    _F32,
    *(_I64,) * 11,
)


@jit.njit([_ROWS])
def _rows(
    x,
    w,
    bias,
    out,
    res,
    zero,
    has_res,
    has_clip,
    lo,
    hi,
    height,
    width,
    channels,
    ho,
    wo,
    sh,
    sw,
    pt,
    pl,
    first,
    last,
):  # noqa: ANN001, ANN202
    """Output rows [first, last) (index = image * Ho + row): per row and block of 16 channels,
    the pixels whose windows lie inside the image in one unchecked call, the border ones in
    checked calls.  Called for all rows (one thread) or per row by ``_rows_parallel``."""
    flags = (1 if has_res else 0) | (2 if has_clip else 0)
    inner_first = min(wo, (pl + sw - 1) // sw)  # the first output column with no tap left of 0
    inner_last = max(inner_first, min(wo, (width - 3 + pl) // sw + 1))
    plane, line = height * width * channels, width * channels
    for index in range(first, last):
        n, oh = index // ho, index % ho
        top = oh * sh - pt
        base = n * plane + top * line
        valid = 0
        for i in range(3):
            if 0 <= top + i < height:
                valid |= 1 << i
        # a row outside the image is never read (its taps read zeros): any offset will do
        r0 = base if valid & 1 else 0
        r1 = base + line if valid & 2 else 0
        r2 = base + 2 * line if valid & 4 else 0
        oo = index * wo * channels
        for c0 in range(0, channels, LANES):
            if valid != 7:
                _checked(
                    x,
                    r0,
                    r1,
                    r2,
                    valid,
                    channels,
                    width,
                    -pl,
                    sw,
                    wo,
                    c0,
                    w,
                    bias,
                    out,
                    oo,
                    res,
                    oo,
                    flags,
                    lo,
                    hi,
                    zero,
                )
                continue
            if inner_first > 0:
                _checked(
                    x,
                    r0,
                    r1,
                    r2,
                    valid,
                    channels,
                    width,
                    -pl,
                    sw,
                    inner_first,
                    c0,
                    w,
                    bias,
                    out,
                    oo,
                    res,
                    oo,
                    flags,
                    lo,
                    hi,
                    zero,
                )
            if inner_last > inner_first:
                at = oo + inner_first * channels
                _inside(
                    x,
                    r0,
                    r1,
                    r2,
                    valid,
                    channels,
                    width,
                    inner_first * sw - pl,
                    sw,
                    inner_last - inner_first,
                    c0,
                    w,
                    bias,
                    out,
                    at,
                    res,
                    at,
                    flags,
                    lo,
                    hi,
                    zero,
                )
            if wo > inner_last:
                at = oo + inner_last * channels
                _checked(
                    x,
                    r0,
                    r1,
                    r2,
                    valid,
                    channels,
                    width,
                    inner_last * sw - pl,
                    sw,
                    wo - inner_last,
                    c0,
                    w,
                    bias,
                    out,
                    at,
                    res,
                    at,
                    flags,
                    lo,
                    hi,
                    zero,
                )


@jit.njit([_ROWS], parallel=True)
def _rows_parallel(
    x,
    w,
    bias,
    out,
    res,
    zero,
    has_res,
    has_clip,
    lo,
    hi,
    height,
    width,
    channels,
    ho,
    wo,
    sh,
    sw,
    pt,
    pl,
    first,
    last,
):  # noqa: ANN001, ANN202
    for index in prange(first, last):
        _rows(
            x,
            w,
            bias,
            out,
            res,
            zero,
            has_res,
            has_clip,
            lo,
            hi,
            height,
            width,
            channels,
            ho,
            wo,
            sh,
            sw,
            pt,
            pl,
            index,
            index + 1,
        )


_ZEROS = np.zeros(LANES, np.float32)


def vec_ok(x_shape: Sequence[int], w_shape: Sequence[int], attrs: dict[str, Any]) -> bool:
    """Depthwise 3x3, no dilation, channels a multiple of 16."""
    dilated = any(d != 1 for d in attrs.get("dilations") or [])
    return (
        depthwise_ok(x_shape, w_shape, int(attrs.get("group", 1)))
        and tuple(w_shape[2:]) == (3, 3)
        and not dilated
        and x_shape[1] % LANES == 0
    )


def _setup(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]) -> tuple | None:
    """What the rows need besides the image (packed taps, bias, clip, geometry, the output's
    channels-last shape), or None when the node is not for this kernel."""
    if not vec_ok(x.shape, w.shape, attrs):
        return None
    found = _arguments([x, w, b], attrs)
    if found is None:
        return None
    _, wk, bias, _, flags, (ho, wo) = found
    _, has_clip, lo, hi, sh, sw, _, _, pt, pl = flags
    n, c, height, width = x.shape
    taps = np.ascontiguousarray(wk.transpose(1, 2, 0)).reshape(-1)
    return taps, bias, has_clip, lo, hi, (height, width, c, ho, wo, sh, sw, pt, pl), (n, ho, wo, c)


_MEMO = NodeMemo()


def conv_depthwise_jit_vec(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Depthwise 3x3 conv of float32 input computed channels last, 16 channels per register,
    bias, residual and a fused Relu / Clip (``fuses_clip``) before the one store; the result a
    channels-last view.  Other shapes go to depthwise_jit's channels-last kernel."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    found = None if x is None or w is None else _MEMO.get(attrs, (w, b), x, lambda: _setup(x, w, b, attrs))
    if found is not None and residual is not None:
        n, ho, wo, c = found[-1]
        if residual.dtype != np.float32 or residual.shape != (n, c, ho, wo):
            found = None  # the fallback says what is wrong, or handles it
    if found is None:
        return conv_depthwise_jit_nhwc(inputs, attrs)
    taps, bias, has_clip, lo, hi, geometry, shape = found
    pixels = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # free for a channels-last view
    out = aligned_empty(shape, np.float32, address)
    res = _ZEROS if residual is None else np.ascontiguousarray(residual.transpose(0, 2, 3, 1)).reshape(-1)
    args = (
        pixels.reshape(-1),
        taps,
        bias,
        out.reshape(-1),
        res,
        _ZEROS,
        residual is not None,
        has_clip,
        lo,
        hi,
    )
    shared = team.worth_sharing(shape[0] * shape[1] * shape[2] * shape[3] * 9)  # as the GEMM's
    team.run(team.DEPTHWISE, _rows, _rows_parallel, *args, *geometry, 0, shape[0] * shape[1], shared=shared)
    return [out.transpose(0, 3, 1, 2)]


conv_depthwise_jit_vec.fuses_clip = True  # type: ignore[attr-defined]
conv_depthwise_jit_vec.jit = True  # type: ignore[attr-defined]


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return []
    return [conv_depthwise_jit_vec] if vec_ok(shapes[0], shapes[1], attrs) else []


CANDIDATES = {"Conv": _conv_candidates}
