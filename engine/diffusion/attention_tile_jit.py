"""Flash attention in registers for 8- and 16-wide heads: an LLVM IR micro-kernel (numba).

attention_jit.py's kernel keeps a block of 64 query rows' scores, [T, 64], in L2 and makes five
passes over them (scores, minus the max, the polynomial, the exponent bits, p v), with p v's
accumulators in memory: a load and a store per multiply-add.  Here a tile of 16 query rows (one
16-lane vector per head channel) lives in registers with its accumulators, and each key is one
step over them: its score for the 16 rows (D fused multiply-adds of q's vectors by the key's
broadcast channels), 2^(score - max), the row sums and p v (W multiply-adds by v's broadcast
channels).  Nothing of size T is written.  The rows' exact max needs the scores first, so a
first pass over the keys computes them for the max alone (D multiply-adds and a max a key) and
the second recomputes them: cheaper than a [T, 16] round trip through L2.

2^x is exp_jit's polynomial with its constants and order of operations; its 2^round(x) is the
bits of x + 1.5 * 2^23 (whose low bits hold round(x)) plus 127, shifted into the exponent, with
no float-to-int conversion (a NaN's conversion would be poison in LLVM IR; its bits are just bits
and NaN times them is NaN).  Scores and p v sum over the head's channels and keys in order, with
fused multiply-adds: results differ from the batched numpy kernel's by float32 rounding.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.ops import exp_jit

TILE = 16  # query rows per tile: one 16-lane vector per head channel
WIDTHS = (8, 16)  # head widths (q's depth = v's width) with a register kernel
_POLY = (exp_jit._C6, exp_jit._C5, exp_jit._C4, exp_jit._C3, exp_jit._C2, exp_jit._C1, exp_jit._C0)


class _Builder:
    """The vector helpers the micro-kernel's IR is written with."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder
        self.i32, self.i64 = ir.IntType(32), ir.IntType(64)
        self.vec = ir.VectorType(ir.FloatType(), TILE)
        self.ivec = ir.VectorType(self.i32, TILE)
        module = builder.module
        self.fma_fn = cgutils.get_or_insert_function(
            module, ir.FunctionType(self.vec, [self.vec] * 3), f"llvm.fma.v{TILE}f32"
        )
        self.undef = ir.Constant(self.vec, ir.Undefined)

    def const(self, value: float) -> Any:
        return ir.Constant(self.vec, [float(value)] * TILE)

    def index(self, value: int) -> Any:
        return ir.Constant(self.i64, value)

    def splat(self, value: Any) -> Any:
        first = self.b.insert_element(self.undef, value, ir.Constant(self.i32, 0))
        return self.b.shuffle_vector(first, self.undef, ir.Constant(self.ivec, [0] * TILE))

    def vector(self, base: Any, offset: Any) -> Any:
        return self.b.bitcast(self.b.gep(base, [offset]), self.vec.as_pointer())

    def scalar(self, base: Any, offset: Any) -> Any:
        return self.b.load(self.b.gep(base, [offset]))

    def fma(self, a: Any, b: Any, c: Any) -> Any:
        return self.b.call(self.fma_fn, [a, b, c])

    def select_if(self, predicate: str, value: Any, bound: Any) -> Any:
        """bound where ``value predicate bound`` (ordered: a NaN stays)."""
        return self.b.select(self.b.fcmp_ordered(predicate, value, bound), bound, value)

    def exp2(self, x: Any) -> Any:
        """exp_jit.exp2_row's 2^x on a vector (same clamp, rounding, polynomial)."""
        b = self
        x = b.select_if("<", x, b.const(exp_jit.LOW))
        x = b.select_if(">", x, b.const(exp_jit.HIGH))
        shifted = b.b.fadd(x, b.const(exp_jit._ROUNDER))
        whole = b.b.fsub(shifted, b.const(exp_jit._ROUNDER))
        f = b.b.fsub(x, whole)
        p = b.const(_POLY[0])
        for c in _POLY[1:]:
            p = b.fma(p, f, b.const(c))
        # low bits of x + 1.5 * 2^23 are round(x): + 127, shifted, the exponent of 2^round(x)
        bits = b.b.bitcast(shifted, b.ivec)
        bits = b.b.shl(b.b.add(bits, ir.Constant(b.ivec, [127] * TILE)), ir.Constant(b.ivec, [23] * TILE))
        return b.b.fmul(p, b.b.bitcast(bits, b.vec))

    def score(self, qs: list[Any], k: Any, at: Any) -> Any:
        """One key's scores for the tile's rows: sum_j q[j] * k[at + j], in order of j."""
        s = ir.Constant(self.vec, None)
        for j, qj in enumerate(qs):
            s = self.fma(qj, self.splat(self.scalar(k, self.b.add(at, self.index(j)))), s)
        return s


def _micro(depth: int, width: int) -> Any:
    """tile[j * 16 + r] = sum_t 2^(s[t, r] - max_t s[., r]) v[t, j] / sum_t 2^(...) for the 16
    rows r of q[qo + j * 16 + r] (j < depth), s[t, r] = sum_j q[j, r] k[ko + t * depth + j],
    v at vo + t * width + j, t < keys (flat float32 arrays, element offsets)."""

    @intrinsic
    def micro(typingctx, q, qo, k, ko, v, vo, keys, scores, tile):  # noqa: ANN001, ANN202, ARG001
        sig = types.void(q, qo, k, ko, v, vo, keys, scores, tile)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            q_, qo_, k_, ko_, v_, vo_, keys_, scores_, tile_ = args
            qp, kp, vp, sp, tp = (
                context.make_array(signature.args[i])(context, builder, value).data
                for i, value in ((0, q_), (2, k_), (4, v_), (7, scores_), (8, tile_))
            )
            b = _Builder(builder)
            qs = [
                builder.load(b.vector(qp, builder.add(qo_, b.index(j * TILE))), align=4) for j in range(depth)
            ]
            top = cgutils.alloca_once_value(builder, b.const(float("-inf")))
            with cgutils.for_range(builder, keys_) as loop:
                s = b.score(qs, kp, builder.add(ko_, builder.mul(loop.index, b.index(depth))))
                builder.store(s, b.vector(sp, builder.mul(loop.index, b.index(TILE))), align=4)
                builder.store(b.select_if("<", builder.load(top), s), top)
            zero = ir.Constant(b.vec, None)
            total = cgutils.alloca_once_value(builder, zero)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(width)]
            peak = builder.load(top)
            with cgutils.for_range(builder, keys_) as loop:
                t = loop.index
                s = builder.load(b.vector(sp, builder.mul(t, b.index(TILE))), align=4)
                p = b.exp2(builder.fsub(s, peak))
                builder.store(builder.fadd(builder.load(total), p), total)
                row = builder.add(vo_, builder.mul(t, b.index(width)))
                for j, acc in enumerate(accs):
                    vj = b.splat(b.scalar(vp, builder.add(row, b.index(j))))
                    builder.store(b.fma(vj, p, builder.load(acc)), acc)
            inverse = builder.fdiv(b.const(1.0), builder.load(total))
            for j, acc in enumerate(accs):
                builder.store(
                    builder.fmul(builder.load(acc), inverse), b.vector(tp, b.index(j * TILE)), align=4
                )
            return context.get_dummy_value()

        return sig, codegen

    return micro


MICRO = {width: _micro(width, width) for width in WIDTHS}
micro8, micro16 = MICRO[8], MICRO[16]
