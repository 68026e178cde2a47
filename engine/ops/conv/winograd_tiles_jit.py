"""Winograd's tile transforms as JIT passes, for the slot products on the JIT GEMM (winograd_jit).

winograd.py's numpy forms gather every input tile into a buffer 2.25x (F(4x4)) or 4x (F(2x2))
the image, transform it with two small-K matrix products, and on the way out run two more
products, a transposing copy into the image and a separate residual and clip pass: each a pass
over a buffer larger than L2.  On a Cascade Lake core they took 1.7-2x the slot GEMM's own time
on ResNet18's 56x56 layers.  Here one pass reads the zero-padded channels-last image and writes
B^T d B, and one pass reads the slot products and writes A^T m A plus bias, residual and
Relu / Clip straight into the channels-last output, only the pixels inside it.

A tile's 16 or 36 vectors of 16 channels are loaded once into vector registers, transformed
there and stored once (LLVM IR, ``numba.extending.intrinsic``, as gemm_jit's micro-kernel): a
loop per transformed vector over channels, the form numba's vectoriser takes, read each input
four or five times and spent more in loop set-up than in the loop at 64 channels.  The sums
follow each matrix row's nonzero entries in column order.  Channels past the last multiple of
16 run the same code one lane wide.  Work items are rows of tiles: one call for all (one thread)
or a parallel loop over them.
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
from engine.ops.conv.winograd import _WINO4_AT, _WINO4_BT, _WINO_AT, _WINO_BT
from engine.ops.int_dot_ir import splat

LANES = 16
# step (output pixels per tile side) -> (B^T, A^T)
_MATRICES = {4: (_WINO4_BT, _WINO4_AT), 2: (_WINO_BT, _WINO_AT)}
_I64 = ir.IntType(64)


def _combine(builder: ir.IRBuilder, row: np.ndarray, values: list[Any], vec: ir.VectorType) -> Any:
    """sum_j row[j] * values[j] over the nonzero entries, in column order (1 and -1 as adds)."""
    total = None
    for weight, value in zip(row, values, strict=True):
        if weight == 0:
            continue
        term = (
            value
            if abs(weight) == 1
            else builder.fmul(value, ir.Constant(vec, [float(abs(weight))] * vec.count))
        )
        if total is None:
            total = term if weight > 0 else builder.fneg(term)
        else:
            total = builder.fadd(total, term) if weight > 0 else builder.fsub(total, term)
    return total


def _vector_at(builder: ir.IRBuilder, base: Any, offset: Any, vec: ir.VectorType) -> Any:
    return builder.bitcast(builder.gep(base, [offset]), vec.as_pointer())


def _offset(builder: ir.IRBuilder, start: Any, *terms: tuple[int, Any]) -> Any:
    """start + sum of constant * value."""
    for factor, value in terms:
        if factor:
            start = builder.add(start, builder.mul(ir.Constant(_I64, factor), value))
    return start


def _tile_input(step: int, lanes: int) -> Any:
    """v[dst + (a * size + b) * plane + (0..lanes)] = (B^T d B)[a, b] for the tile whose
    top-left value is xp[base] (rows ``row`` apart, columns ``c`` apart)."""
    bt = _MATRICES[step][0]
    size = bt.shape[0]

    @intrinsic
    def tile(typingctx, xp, base, row, c, v, dst, plane):  # noqa: ANN001, ANN202, ARG001
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            xp_, base_, row_, c_, v_, dst_, plane_ = args
            source = context.make_array(signature.args[0])(context, builder, xp_).data
            target = context.make_array(signature.args[4])(context, builder, v_).data
            vec = ir.VectorType(ir.FloatType(), lanes)
            d = [
                [
                    builder.load(
                        _vector_at(builder, source, _offset(builder, base_, (a, row_), (b, c_)), vec), align=4
                    )
                    for b in range(size)
                ]
                for a in range(size)
            ]
            columns = [[d[j][b] for j in range(size)] for b in range(size)]
            half = [[_combine(builder, bt[a], columns[b], vec) for b in range(size)] for a in range(size)]
            for a in range(size):
                for b in range(size):
                    value = _combine(builder, bt[b], half[a], vec)
                    at = _offset(builder, dst_, (a * size + b, plane_))
                    builder.store(value, _vector_at(builder, target, at, vec), align=4)
            return context.get_dummy_value()

        return types.void(xp, base, row, c, v, dst, plane), codegen

    return tile


def _tile_output(step: int, lanes: int) -> Any:
    """out[dst + i * orow + j * m + (0..lanes)] = clip((A^T p A)[i, j] + bias[k] (+ res at the
    same offset)) for i < rows, j < cols, from the tile's products prod[src + s * plane + ...]
    (s = a * size + b); ``k`` is the first channel."""
    at_matrix = _MATRICES[step][1]
    size = at_matrix.shape[1]

    @intrinsic
    def tile(typingctx, prod, src, plane, out, dst, orow, m, bias, k, res, flags, lo, hi, rows, cols):  # noqa: ANN001, ANN202, ARG001, E501
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            prod_, src_, plane_, out_, dst_, orow_, m_, bias_, k_, res_, flags_, lo_, hi_, rows_, cols_ = args
            source, target, bp, rp = (
                context.make_array(signature.args[i])(context, builder, value).data
                for i, value in ((0, prod_), (3, out_), (7, bias_), (9, res_))
            )
            vec = ir.VectorType(ir.FloatType(), lanes)
            p = [
                [
                    builder.load(
                        _vector_at(builder, source, _offset(builder, src_, (a * size + b, plane_)), vec),
                        align=4,
                    )
                    for b in range(size)
                ]
                for a in range(size)
            ]
            columns = [[p[a][b] for a in range(size)] for b in range(size)]
            half = [
                [_combine(builder, at_matrix[i], columns[b], vec) for b in range(size)] for i in range(step)
            ]
            bias = builder.load(_vector_at(builder, bp, k_, vec), align=4)
            has_res = builder.trunc(builder.and_(flags_, ir.Constant(_I64, 1)), ir.IntType(1))
            has_clip = builder.trunc(builder.lshr(flags_, ir.Constant(_I64, 1)), ir.IntType(1))
            low, high = splat(builder, lo_, vec), splat(builder, hi_, vec)
            for i in range(step):
                for j in range(step):
                    inside = builder.and_(
                        builder.icmp_signed("<", ir.Constant(_I64, i), rows_),
                        builder.icmp_signed("<", ir.Constant(_I64, j), cols_),
                    )
                    with builder.if_then(inside):
                        value = builder.fadd(_combine(builder, at_matrix[j], half[i], vec), bias)
                        at = _offset(builder, dst_, (i, orow_), (j, m_))
                        slot = cgutils.alloca_once_value(builder, value)  # a register after mem2reg
                        with builder.if_then(has_res):
                            residual = builder.load(_vector_at(builder, rp, at, vec), align=4)
                            builder.store(builder.fadd(builder.load(slot), residual), slot)
                        value = builder.load(slot)
                        # comparisons, not min/max: a NaN stays NaN, as np.clip leaves it
                        clipped = builder.select(builder.fcmp_ordered(">", value, high), high, value)
                        clipped = builder.select(builder.fcmp_ordered("<", clipped, low), low, clipped)
                        result = builder.select(has_clip, clipped, value)
                        builder.store(result, _vector_at(builder, target, at, vec), align=4)
            return context.get_dummy_value()

        sig = types.void(prod, src, plane, out, dst, orow, m, bias, k, res, flags, lo, hi, rows, cols)
        return sig, codegen

    return tile


_in4, _in4_1 = _tile_input(4, LANES), _tile_input(4, 1)
_in2, _in2_1 = _tile_input(2, LANES), _tile_input(2, 1)
_out4, _out4_1 = _tile_output(4, LANES), _tile_output(4, 1)
_out2, _out2_1 = _tile_output(2, LANES), _tile_output(2, 1)

_F32_IN = jit.array(types.float32, 1, "C", readonly=True)
_F32_OUT = jit.array(types.float32, 1, "C")
# padded image (ph * pw * C), slots (size^2 * tiles * C); step, pw, C, th, tw, first and last
# row of tiles
_INPUT = types.void(_F32_IN, _F32_OUT, *(types.int64,) * 7)
# products (size^2 * tiles * M), output (Ho * Wo * M), bias (M), residual (Ho * Wo * M, or one
# value); flags (1 residual, 2 clip), low, high; step, M, th, tw, Ho, Wo, first and last row
_OUTPUT = types.void(
    _F32_IN, _F32_OUT, _F32_IN, _F32_IN, types.int64, types.float32, types.float32, *(types.int64,) * 8
)


@jit.njit([_INPUT])
def _inputs(xp, v, step, pw, c, th, tw, first, last):  # noqa: ANN001, ANN202
    plane, row = th * tw * c, pw * c
    wide = c - c % LANES
    for ti in range(first, last):
        for tj in range(tw):
            base, dst = (step * ti * pw + step * tj) * c, (ti * tw + tj) * c
            if step == 4:
                for k in range(0, wide, LANES):
                    _in4(xp, base + k, row, c, v, dst + k, plane)
                for k in range(wide, c):
                    _in4_1(xp, base + k, row, c, v, dst + k, plane)
            else:
                for k in range(0, wide, LANES):
                    _in2(xp, base + k, row, c, v, dst + k, plane)
                for k in range(wide, c):
                    _in2_1(xp, base + k, row, c, v, dst + k, plane)


@jit.njit([_OUTPUT])
def _outputs(prod, out, bias, res, flags, lo, hi, step, m, th, tw, ho, wo, first, last):  # noqa: ANN001, ANN202
    plane, orow = th * tw * m, wo * m
    wide = m - m % LANES
    for ti in range(first, last):
        rows = min(step, ho - step * ti)
        for tj in range(tw):
            cols = min(step, wo - step * tj)
            src, dst = (ti * tw + tj) * m, (step * ti * wo + step * tj) * m
            if step == 4:
                for k in range(0, wide, LANES):
                    _out4(
                        prod, src + k, plane, out, dst + k, orow, m, bias, k, res, flags, lo, hi, rows, cols
                    )
                for k in range(wide, m):
                    _out4_1(
                        prod, src + k, plane, out, dst + k, orow, m, bias, k, res, flags, lo, hi, rows, cols
                    )
            else:
                for k in range(0, wide, LANES):
                    _out2(
                        prod, src + k, plane, out, dst + k, orow, m, bias, k, res, flags, lo, hi, rows, cols
                    )
                for k in range(wide, m):
                    _out2_1(
                        prod, src + k, plane, out, dst + k, orow, m, bias, k, res, flags, lo, hi, rows, cols
                    )


@jit.njit([_INPUT], parallel=True)
def _inputs_parallel(xp, v, step, pw, c, th, tw, first, last):  # noqa: ANN001, ANN202
    for ti in prange(first, last):
        _inputs(xp, v, step, pw, c, th, tw, ti, ti + 1)


@jit.njit([_OUTPUT], parallel=True)
def _outputs_parallel(prod, out, bias, res, flags, lo, hi, step, m, th, tw, ho, wo, first, last):  # noqa: ANN001, ANN202
    for ti in prange(first, last):
        _outputs(prod, out, bias, res, flags, lo, hi, step, m, th, tw, ho, wo, ti, ti + 1)


# Below this many transformed values a pass runs on one thread (numba's pool launch costs more)
MIN_PARALLEL_VALUES = 1 << 18
# ... and below this many under a team run (its worker spins already: a job costs a few us)
TEAM_MIN_VALUES = 1 << 14
_NO_RESIDUAL = np.zeros(1, np.float32)


def transform_input(xp: np.ndarray, v: np.ndarray, step: int, th: int, tw: int) -> None:
    """v (size^2, th * tw, C) = B^T d B of every tile of the padded channels-last image xp
    (step * th + 2, step * tw + 2, C); ``step`` 4 for F(4x4, 3x3), 2 for F(2x2, 3x3)."""
    args = (xp.reshape(-1), v.reshape(-1), step, xp.shape[1], xp.shape[2], th, tw, 0, th)
    _run(team.WINO_IN, _inputs, _inputs_parallel, v.size, args)


def transform_output(
    prod: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray,
    residual: np.ndarray | None,
    bounds: tuple[Any, Any] | None,
    step: int,
    th: int,
    tw: int,
) -> None:
    """out (Ho, Wo, M) = A^T p A + bias (+ residual (Ho, Wo, M), clipped to ``bounds``) for the
    slot products prod (size^2, th * tw, M); all C-contiguous float32, bias (M,)."""
    flags = (1 if residual is not None else 0) | (2 if bounds is not None else 0)
    _, lo, hi = clip_floats(bounds)
    res = _NO_RESIDUAL if residual is None else residual.reshape(-1)
    ho, wo, m = out.shape
    args = (prod.reshape(-1), out.reshape(-1), bias, res, flags, lo, hi, step, m, th, tw, ho, wo, 0, th)
    _run(team.WINO_OUT, _outputs, _outputs_parallel, prod.size, args)


def _run(kind: int, serial: Any, parallel: Any, values: int, args: tuple) -> None:
    """A pass by rows of tiles: shared with a team run's worker (which held numba's pool closed:
    the transforms ran on the caller alone, 0.7x of F(4x4)'s 1-thread time at 2 threads), on
    numba's pool for a big one, else on this thread."""
    least = TEAM_MIN_VALUES if team.active() is not None else MIN_PARALLEL_VALUES
    team.run(kind, serial, parallel, *args, shared=values >= least and jit.threads() > 1)
