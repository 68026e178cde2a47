"""uint8 x int8 GEMM in integers (numba): a QMatMul whose activations arrive quantized.

A package converted with static int8 activations (converter/calibrate.py) reads every
quantized MatMul's input through QuantizeLinear -> DequantizeLinear (uint8, per tensor).  Run as
written that is float work twice over; the planner (engine/fuse_qdq.py) instead hands the
uint8 values themselves to ``qdq_matmul_jit``, which multiplies them with the int8 weights in
exact int32 sums and scales once:

    y[m, n] = a_scale * w_scale[n] * (sum_k q[m, k] * w[k, n] - a_zero * sum_k w[k, n]) + bias[n]

The unfused form sums the same exact products in float32, so the two agree to float32
rounding of a K-term sum.

Layout: the weights are packed once per plan as [N/64, K/4, 64, 4] (zero-padded): one step of
the inner loop loads 4 vectors of 16 columns x 4 consecutive k, and each of 4 rows' next 4
activation bytes is broadcast to all 16 lanes; with AVX-512 VNNI one vpdpbusd instruction adds
64 products into 16 int32 sums; with AVX2 (no VNNI) four vpmaddwd on the weights stored as
16-bit words (int_dot_ir.words, twice the bytes), one column vector per pass over K; elsewhere
generic LLVM IR (widen, multiply, add the four products of a lane).  A tile keeps 4 rows x 64
columns of sums (16 vectors) in registers for the whole K loop.  Measured on one core (ViT-Tiny
and BERT shapes, 128-197 rows): 4.5-7.5x the float32 BLAS GEMM's speed on the same shapes,
545-900 G int ops/s with VNNI; with AVX2 (AMD EPYC Zen 3, busy shared host) 1-2x, 60-110 G int
ops/s (the generic IR: ~10x slower than BLAS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine import jit
from engine.ops import int_dot_ir
from engine.ops.dynamic_quantize import dynamic_quantize_linear, parameters
from engine.ops.fused import apply_activation
from engine.ops.qdq_matmul import qdq_matmul, qdq_operands, scalar_of
from engine.ops.quantized import quantize_linear
from engine.ops.registry import Kernel

ROWS = 4  # rows of a tile
VECTORS = 4  # column vectors of a tile (16 int32 lanes each): 64 columns
COLUMNS = 16 * VECTORS

VNNI = int_dot_ir.VNNI
_dot, _pointer, _splat = int_dot_ir.dot, int_dot_ir.pointer, int_dot_ir.splat
_I32, _I64, _SUMS = int_dot_ir.I32, ir.IntType(64), int_dot_ir.SUMS
# AVX2 (no VNNI): the weights are stored as int_dot_ir.words (16-bit, 2 bytes a weight), and a
# pass over K takes one column vector: its 4 rows x 2 halves of sums and 4 halves of weights fit
# AVX2's 16 registers (all 4 vectors' sums, as with AVX-512's 32, would spill every step)
WORDS = int_dot_ir.PATH == "avx2"
WIDTH = 2 if WORDS else 1  # bytes per packed weight
GROUP = 1 if WORDS else VECTORS  # column vectors per pass over K


def _tile_pass(context, builder, kinds, args, vectors: range) -> None:  # noqa: ANN001
    """One pass of ``_tile`` over K for the column vectors ``vectors``: their ROWS x len(vectors)
    sums kept in registers for the whole loop (allocas LLVM promotes), then stored."""
    q, q_at, q_stride, w, w_at, steps, sums = args
    acc = {
        (r, v): cgutils.alloca_once_value(builder, ir.Constant(_SUMS, None))
        for r in range(ROWS)
        for v in vectors
    }

    def load(at: ir.Value, offset: int) -> ir.Value:
        where = builder.add(at, ir.Constant(_I64, offset))
        return builder.load(_pointer(context, builder, kinds[3], w, where, _SUMS), align=1)

    with cgutils.for_range(builder, steps) as loop:
        base = builder.add(w_at, builder.mul(loop.index, ir.Constant(_I64, 4 * COLUMNS * WIDTH)))
        if WORDS:  # even words then odd words per vector
            weights = {v: (load(base, 128 * v), load(base, 128 * v + 64)) for v in vectors}
        else:
            weights = {v: load(base, 64 * v) for v in vectors}
        for r in range(ROWS):
            row = builder.add(q_at, builder.mul(q_stride, ir.Constant(_I64, r)))
            at = builder.add(row, builder.mul(loop.index, ir.Constant(_I64, 4)))
            four = builder.load(_pointer(context, builder, kinds[0], q, at, _I32), align=1)
            broadcast = _splat(builder, four, _SUMS)
            for v in vectors:
                before = builder.load(acc[r, v])
                if WORDS:
                    after = int_dot_ir.dot_words(
                        builder, before, *int_dot_ir.unsigned_words(builder, broadcast), *weights[v]
                    )
                else:
                    after = _dot(builder, before, broadcast, weights[v])
                builder.store(after, acc[r, v])
    for (r, v), sum_ in acc.items():
        target = _pointer(context, builder, kinds[6], sums, ir.Constant(_I64, (r * VECTORS + v) * 16), _SUMS)
        builder.store(builder.load(sum_), target, align=4)


@intrinsic
def _tile(typingctx, q, q_at, q_stride, w, w_at, steps, sums):  # noqa: ANN001, ANN202, ARG001
    """sums[r * 64 + c] (int32) = sum over ``steps`` steps s of the 4 bytes q[q_at + r * q_stride
    + 4 s ..] (uint8) times weight column c's 4 bytes of step s at w[w_at + 256 WIDTH s ..]
    (int8, or their words)."""
    sig = types.void(q, q_at, q_stride, w, w_at, steps, sums)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        for first in range(0, VECTORS, GROUP):
            _tile_pass(context, builder, signature.args, args, range(first, first + GROUP))
        return context.get_dummy_value()

    return sig, codegen


_Q = jit.array(types.uint8, 2, "C", readonly=True)
_W = jit.array(types.int8, 1, "C", readonly=True)
_I32S = jit.array(types.int32, 1, "C", readonly=True)
_F = jit.array(types.float32, 1, "C", readonly=True)
_OUT = jit.array(types.float32, 2, "C")
# q [M', K'] (rows padded to ROWS, K' to 4), packed weights, then per column: the zero point's
# share a_zero * sum_k w (int32), the scale a_scale * w_scale and the bias; out [M, N], then the
# column blocks [first, last)
_GEMM = types.void(_Q, _W, _I32S, _F, _F, _OUT, types.int64, types.int64)


@jit.njit([_GEMM], error_model="numpy")
def _gemm_blocks(q, w, zero_sums, scale, offset, out, first, last):  # noqa: ANN001, ANN202
    """out[m, j] = float(sum_k q[m, k] w[k, j] - zero_sums[j]) * scale[j] + offset[j]: the zero
    point taken out in exact integers, then one branch-free pass LLVM vectorises."""
    rows, n = out.shape
    depth = q.shape[1]
    steps = depth // 4
    sums = np.empty(ROWS * COLUMNS, np.int32)
    flat = q.reshape(-1)
    for block in range(first, last):
        start = block * COLUMNS
        width = min(n, start + COLUMNS) - start
        for m in range(0, rows, ROWS):
            _tile(flat, m * depth, depth, w, block * steps * 4 * COLUMNS * WIDTH, steps, sums)
            for r in range(min(ROWS, rows - m)):
                target = out[m + r, start : start + width]
                tile = sums[r * COLUMNS : r * COLUMNS + width]
                zeros, scales, offsets = zero_sums[start:], scale[start:], offset[start:]
                for c in range(width):
                    target[c] = np.float32(tile[c] - zeros[c]) * scales[c] + offsets[c]


@jit.njit([_GEMM], parallel=True, error_model="numpy")
def _gemm_parallel(q, w, zero_sums, scale, offset, out, first, last):  # noqa: ANN001, ANN202
    for block in prange(first, last):
        _gemm_blocks(q, w, zero_sums, scale, offset, out, block, block + 1)


def gemm(
    q: np.ndarray,
    packed: np.ndarray,
    column_sums: np.ndarray,
    a_scale: np.ndarray,
    a_zero: np.ndarray,
    w_scale: np.ndarray,
    bias: np.ndarray | None,
    rows: int,
) -> np.ndarray:
    """[rows, N] float32 = a_scale * w_scale * (q @ w - a_zero * column sums) + bias, for q
    [M', K'] uint8 (rows padded to ROWS, K' to a multiple of 4) and ``pack_weights``'s w."""
    n = w_scale.size
    scale = np.float32(a_scale.reshape(-1)[0]) * w_scale.reshape(-1).astype(np.float32)
    zero_sums = (np.int32(a_zero.reshape(-1)[0]) * column_sums).astype(np.int32)
    offset = np.zeros(n, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
    out = np.empty((rows, n), np.float32)
    jit.run(_gemm_blocks, _gemm_parallel, q, packed, zero_sums, scale, offset, out, 0, -(-n // COLUMNS))
    return out


def pack_weights(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 [K, N] -> (flat int8 [N/64, K/4, 64, 4] zero-padded, int32 column sums [N]); with
    WORDS each step's 4 vectors as int_dot_ir.words (int16, the bytes as int8)."""
    k, n = x.shape
    depth, width = -(-k // 4) * 4, -(-n // COLUMNS) * COLUMNS
    padded = np.zeros((depth, width), np.int8)
    padded[:k, :n] = x
    packed = padded.reshape(depth // 4, 4, width // COLUMNS, COLUMNS).transpose(2, 0, 3, 1)
    packed = int_dot_ir.words(packed.reshape(*packed.shape[:2], VECTORS, 16, 4)) if WORDS else packed
    return np.ascontiguousarray(packed).reshape(-1).view(np.int8), x.sum(axis=0, dtype=np.int32)


def pack(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> dict[int, np.ndarray]:
    """The weights (input 3) packed for the tile, the column sums in the zero point's place
    (input 5, unused by the int8 form: no weight zero point)."""
    if not qdq_operands(inputs, attrs):
        return {}
    packed, colsum = pack_weights(inputs[3])
    return {3: packed, 5: colsum}


def qdq_matmul_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: q (uint8 activations [..., K]), a_scale, a_zero, weights int8 [K, N] (or packed:
    1-D), w_scale [N], column sums (packed) or None, bias [N] or None."""
    q, a_scale, a_zero, w, w_scale = inputs[:5]
    bias = inputs[6] if len(inputs) > 6 else None
    if w.ndim != 1:  # unpacked (a first run): pack now
        if not qdq_operands(inputs, attrs):
            return qdq_matmul(inputs, attrs)
        w, colsum = pack_weights(w)
    else:
        colsum = inputs[5]
    k = q.shape[-1]
    rows = q.size // k if k else 0
    flat = q.reshape(rows, k)
    if rows % ROWS == 0 and k % 4 == 0 and flat.flags.c_contiguous:
        padded = flat  # whole tiles already: no padded copy
    else:
        padded = np.zeros((-(-rows // ROWS) * ROWS, -(-k // 4) * 4), np.uint8)
        padded[:rows, :k] = flat
    out = gemm(padded, w, colsum, a_scale, a_zero, w_scale, bias, rows)
    n = out.shape[1]
    return [apply_activation(out, attrs).reshape((*q.shape[:-1], n))]


qdq_matmul_jit.jit = True  # type: ignore[attr-defined]
qdq_matmul_jit.pack = pack  # type: ignore[attr-defined]


def _candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    return [qdq_matmul_jit]


CANDIDATES = {"QdqMatMul": _candidates}


# -- QuantizeLinear per tensor to uint8 in one pass (numpy: five) --------------------------------

_QUANTIZE = types.void(
    jit.array(types.float32, 1, "C", readonly=True),
    types.float32,
    types.float32,
    jit.array(types.uint8, 1, "C"),
)


@jit.njit([_QUANTIZE], error_model="numpy")
def _quantize(x, scale, zero, out):  # noqa: ANN001, ANN202
    """numpy's saturate(rint(x / scale) + zero) in the same float32 operations: the same bytes."""
    for i in range(x.size):
        value = np.rint(x[i] / scale) + zero
        out[i] = np.uint8(min(max(value, np.float32(0.0)), np.float32(255.0)))


def quantize_linear_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """QuantizeLinear of float32 values to uint8 with one scale and zero point, in the input's
    memory order (a channels-last conv result stays channels last); otherwise numpy's."""
    x, scale = inputs[0], inputs[1]
    zero = inputs[2] if len(inputs) > 2 else None
    order = _memory_order(x)
    per_tensor = scale.size == 1 and scale.dtype == np.float32 and (zero is None or scalar_of(zero, np.uint8))
    if x.dtype != np.float32 or order is None or not per_tensor:
        return quantize_linear(inputs, attrs)
    flat = x.transpose(order)
    out = np.empty(flat.shape, np.uint8)
    point = np.float32(0.0 if zero is None else float(zero.reshape(-1)[0]))
    _quantize(flat.reshape(-1), np.float32(scale.reshape(-1)[0]), point, out.reshape(-1))
    return [out.transpose(np.argsort(order))]


def _memory_order(x: np.ndarray) -> tuple[int, ...] | None:
    """The axis order in which ``x``'s memory is C-contiguous, or None."""
    if x.flags.c_contiguous:
        return tuple(range(x.ndim))
    order = tuple(sorted(range(x.ndim), key=lambda axis: -x.strides[axis]))
    return order if x.transpose(order).flags.c_contiguous else None


quantize_linear_jit.jit = True  # type: ignore[attr-defined]
CANDIDATES["QuantizeLinear"] = lambda attrs, shapes: [quantize_linear_jit]


# -- DynamicQuantizeLinear: the range, then the same one-pass quantize (numpy: seven passes) -----

_RANGE = types.UniTuple(types.float32, 2)(jit.array(types.float32, 1, "C", readonly=True))


# fastmath: min/max without NaN checks vectorise (DynamicQuantizeLinear's input is NaN-free;
# a NaN would make numpy's scale NaN anyway)
@jit.njit([_RANGE], error_model="numpy", fastmath=True)
def _range(x):  # noqa: ANN001, ANN202
    """(min(0, min x), max(0, max x)): the range DynamicQuantizeLinear maps to 0..255."""
    low = np.float32(0.0)
    high = np.float32(0.0)
    for i in range(x.size):
        low = min(low, x[i])
        high = max(high, x[i])
    return low, high


def dynamic_quantize_linear_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """DynamicQuantizeLinear of float32 values with numpy's scale, zero point and bytes
    (dynamic_quantize.py), in the input's memory order like quantize_linear_jit."""
    x = inputs[0]
    order = _memory_order(x)
    if x.dtype != np.float32 or order is None or x.size == 0:
        return dynamic_quantize_linear(inputs, attrs)
    flat = x.transpose(order)
    low, high = _range(flat.reshape(-1))
    scale, zero = parameters(float(low), float(high))
    out = np.empty(flat.shape, np.uint8)
    _quantize(flat.reshape(-1), scale, np.float32(zero), out.reshape(-1))
    return [out.transpose(np.argsort(order)), np.array(scale), np.array(zero)]


dynamic_quantize_linear_jit.jit = True  # type: ignore[attr-defined]
CANDIDATES["DynamicQuantizeLinear"] = lambda attrs, shapes: [dynamic_quantize_linear_jit]
