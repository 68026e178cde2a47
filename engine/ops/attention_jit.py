"""FusedAttention with a JIT softmax (numba): the twin of fused.py's batched numpy attention.

The two products are batched BLAS calls (numba has no BLAS without scipy, and OpenBLAS beats a
plain loop nest at head sizes 32-64), or per head the JIT GEMM's register tiles
(``attention_gemm_per_head``: searched); between them the softmax runs row by row in one JIT call: the
row max, 2^((s - max) * c) by exp_jit's vectorised polynomial (numpy's float32 ``exp`` runs
scalar on AVX2 machines, ~2 ns an element), the sum and the normalisation, each row while it
sits in L1, instead of numpy's five whole-array passes.  Rows in parallel (prange) when the
session allows two threads.  No fastmath: results agree with the numpy kernels to float32
rounding of the exponential (~1e-7 relative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine import jit, team
from engine.ops.conv import gemm8_jit
from engine.ops.conv.gemm_jit import NR, gemm, gemm_batched, pack_panels, pack_slots
from engine.ops.exp_jit import exp2_row
from engine.ops.fused import LOG2_E, _attention_inputs, _attention_output, _base2, fused_attention
from engine.ops.registry import Kernel

_F32 = types.float32
_SOFTMAX = types.void(jit.array(_F32, 2, "C"), _F32, types.int64, types.int64)  # rows [first, last)


_ROW = jit.array(_F32, 1, "C")


@intrinsic
def _max_lanes(typingctx, row, whole):  # noqa: ANN001, ANN202, ARG001
    """max(row[:whole]), ``whole`` a multiple of 8 and at least 8: 8-lane vectors through
    llvm.maxnum (a NaN lane takes the other operand), then across the lanes.  LLVM vectorises
    no max reduction numba writes (a compare and select, without fast-math flags on it): eight
    scalar running maxima took 0.25 ns an element, a third of the softmax's time besides its
    exponential."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vec = ir.VectorType(f32, 8)
        maxnum = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec]), "llvm.maxnum.v8f32"
        )
        across = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32, [vec]), "llvm.vector.reduce.fmax.v8f32"
        )

        def vector(index: Any) -> Any:
            at = builder.gep(data, [builder.mul(index, ir.Constant(i64, 8))])
            return builder.load(builder.bitcast(at, vec.as_pointer()), align=4)

        acc = cgutils.alloca_once_value(builder, vector(ir.Constant(i64, 0)))
        chunks = builder.udiv(args[1], ir.Constant(i64, 8))
        with cgutils.for_range(builder, chunks) as loop:
            builder.store(builder.call(maxnum, [builder.load(acc), vector(loop.index)]), acc)
        return builder.call(across, [builder.load(acc)])

    return types.float32(row, whole), codegen


@jit.njit([_F32(_ROW, types.int64)], error_model="numpy")
def _row_max(row, n):  # noqa: ANN001, ANN202
    """max(row[:n]): whole 8-lane vectors (``_max_lanes``), then the rest.  NaN is not
    propagated here: a NaN score makes its own exponential NaN, and so the row."""
    whole = n - n % 8
    m = _max_lanes(row, whole) if whole >= 8 else row[0]
    for k in range(whole, n):
        m = max(m, row[k])
    return m


@jit.njit([_F32(_ROW, types.int64)], error_model="numpy", fastmath={"reassoc"})
def _row_sum(row, n):  # noqa: ANN001, ANN202
    """sum(row[:n]), reassociated: LLVM keeps partial sums in vector lanes (0.09 ns an element
    at ViT-Tiny's 197-wide rows on Zen 3, where eight scalar partial sums took 0.29: a third of
    the softmax's time besides its exponential).  The order differs from a plain sum's by
    float32 rounding, ~1e-7 relative."""
    total = np.float32(0)
    for k in range(n):
        total += row[k]
    return total


@jit.njit([_SOFTMAX], error_model="numpy")
def _softmax_rows(rows, scale, first, last):  # noqa: ANN001, ANN202
    """rows[r] = softmax(rows[r] * scale) in base 2 (scale = log2(e) for natural-base scores)
    for r in [first, last): called for all (one thread) or per chunk by ``_softmax_parallel``,
    one compiled body for both."""
    n = rows.shape[1]
    spare = np.empty(n, np.float32)
    bits = np.empty(n, np.int32)
    for r in range(first, last):
        row = rows[r]
        exp2_row(row, scale, _row_max(row, n), spare, bits, n)
        inverse = np.float32(1) / _row_sum(spare, n)
        for k in range(n):
            row[k] = spare[k] * inverse


@jit.njit([_SOFTMAX], parallel=True, error_model="numpy")
def _softmax_parallel(rows, scale, first, last):  # noqa: ANN001, ANN202
    chunks = 8
    per = (last - first + chunks - 1) // chunks
    for c in prange(chunks):
        start = min(last, first + c * per)
        _softmax_rows(rows, scale, start, min(last, start + per))


def softmax_rows_into(rows: np.ndarray, scale: float) -> np.ndarray:
    """Row-wise softmax of ``rows * scale`` in base 2, in place (C-contiguous float32 [R, T]):
    shared by rows with engine/team.py's worker during a team run, from team.MIN_ROW_ELEMENTS."""
    args = (rows, np.float32(scale), 0, rows.shape[0])
    if team.active() is not None and rows.size >= team.MIN_ROW_ELEMENTS:
        team.run(team.SOFTMAX, _softmax_rows, _softmax_parallel, *args)
    else:
        jit.run(_softmax_rows, _softmax_parallel, *args)
    return rows


def attention_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """softmax(q @ k^T * scale [+ mask]) @ v: BLAS products, the softmax as one JIT pass per row.
    float32 only (other dtypes take the numpy kernel)."""
    q, keys, v, mask = _attention_inputs(inputs, attrs)
    if not (q.dtype == keys.dtype == v.dtype == np.float32) or 0 in q.shape or 0 in keys.shape:
        return fused_attention(inputs, attrs)
    scores = np.matmul(q, np.swapaxes(keys, -1, -2))  # [..., S, T], fresh and C-contiguous
    if mask is not None:
        if not _adds_to(mask, scores.shape):
            return fused_attention(inputs, attrs)
        scores += mask
    # q carries log2(e) already (base 2) unless a mask keeps the scores in natural units
    scale = 1.0 if _base2(q, mask) else LOG2_E
    softmax_rows_into(scores.reshape(-1, scores.shape[-1]), scale)
    lead = np.broadcast_shapes(scores.shape[:-2], v.shape[:-2])
    result, out = _attention_output(attrs, (*lead, scores.shape[-2], v.shape[-1]), v.dtype)
    np.matmul(scores, v, out=out)
    return [result]


def _per_head(inputs: list[np.ndarray | None], attrs: dict[str, Any]):  # noqa: ANN202
    """(q, k, v broadcast to their common heads, those heads' shape, the result and its per-head
    view) for the per-head kernels, or None where they do not apply (a mask, not float32, empty)."""
    q, keys, v, mask = _attention_inputs(inputs, attrs)
    if mask is not None or not (q.dtype == keys.dtype == v.dtype == np.float32) or 0 in q.shape + keys.shape:
        return None
    lead = np.broadcast_shapes(q.shape[:-2], keys.shape[:-2], v.shape[:-2])
    q, keys, v = (np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in (q, keys, v))
    result, out = _attention_output(attrs, (*lead, q.shape[-2], v.shape[-1]), np.float32)
    return q, keys, v, lead, result, out


def attention_jit_per_head(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """As ``attention_jit``, one head at a time on 2-D matrices (numpy runs a batched matmul of
    strided 4-D views slower than a loop of 2-D BLAS calls at ViT's sizes; BERT's 12 small heads
    go the other way: measured).  Without a mask; float32 only."""
    heads = _per_head(inputs, attrs)
    if heads is None:
        return fused_attention(inputs, attrs)
    q, keys, v, lead, result, out = heads
    scores = np.empty((q.shape[-2], keys.shape[-2]), np.float32)
    for index in np.ndindex(*lead):
        np.matmul(q[index], keys[index].T, out=scores)
        softmax_rows_into(scores, 1.0)
        np.matmul(scores, v[index], out=out[index])
    return [result]


def attention_gemm_per_head(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """As ``attention_jit_per_head`` with both products on the JIT GEMM (conv/gemm_jit.py), k^T
    and v packed into its panels per head (a few us; read straight from the strided views).
    OpenBLAS reaches about half its peak at a head's sizes: ViT's [197, 64] by [64, 197] took
    46 us by BLAS, 29 + 10 to pack here; scores by v 45 against 25 + 5.  Without a mask;
    float32 only."""
    heads = _per_head(inputs, attrs)
    if heads is None:
        return fused_attention(inputs, attrs)
    q, keys, v, lead, result, out = heads
    scores = np.empty((q.shape[-2], keys.shape[-2]), np.float32)
    rows = np.empty(q.shape[-2:], np.float32)
    head_out = np.empty((q.shape[-2], v.shape[-1]), np.float32)
    for index in np.ndindex(*lead):
        np.copyto(rows, q[index])  # the GEMM reads C-contiguous rows; a head's q is strided
        gemm(rows, pack_panels(keys[index].T), scores)
        softmax_rows_into(scores, 1.0)  # q carries log2(e) (base 2): no mask here
        gemm(scores, pack_panels(v[index]), head_out)
        out[index] = head_out
    return [result]


def attention_gemm_heads(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """As ``attention_jit`` with both products on the JIT GEMM, every head in one call each (the
    heads as the GEMM's slots, as Winograd's): two GEMM calls a node where the per-head kernel
    made two a head, and under engine/team.py's worker two shared jobs (ViT-Tiny's three
    heads' products had been too small to gain from sharing one by one).  A mask is added to
    the scores between them.  float32 only."""
    return _gemm_heads(inputs, attrs, gemm_batched, NR)


def attention_gemm_heads8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``attention_gemm_heads`` on gemm8_jit's 6 x 16 tiles (AVX2, where the 6 x 32 tile spills):
    under the team, products, softmax and all are shared."""
    return _gemm_heads(inputs, attrs, gemm8_jit.gemm_batched16, gemm8_jit.NR)


def _gemm_heads(
    inputs: list[np.ndarray | None], attrs: dict[str, Any], batched: Any, panel: int
) -> list[np.ndarray]:
    """attention_gemm_heads on the GEMM ``batched`` over panels ``panel`` columns wide."""
    q, keys, v, mask = _attention_inputs(inputs, attrs)
    if not (q.dtype == keys.dtype == v.dtype == np.float32) or 0 in q.shape + keys.shape + v.shape:
        return fused_attention(inputs, attrs)
    lead = np.broadcast_shapes(q.shape[:-2], keys.shape[:-2], v.shape[:-2])
    queries, (keys_count, width) = q.shape[-2], v.shape[-2:]
    scores_shape = (*lead, queries, keys_count)
    if mask is not None and not _adds_to(mask, scores_shape):
        return fused_attention(inputs, attrs)
    heads = math.prod(lead)

    def by_head(a: np.ndarray) -> np.ndarray:  # [..., R, C] broadcast to the heads: a view
        return np.broadcast_to(a, (*lead, *a.shape[-2:])).reshape(heads, *a.shape[-2:])

    scores = np.empty((heads, queries, keys_count), np.float32)
    # k^T and v packed straight from their views (pack_slots: one pass, ~40 us a ViT-Tiny layer
    # less than copying them contiguous and packing the copies)
    keys_t = pack_slots(np.swapaxes(by_head(keys), -1, -2), panel)
    batched(np.ascontiguousarray(by_head(q)), keys_t, scores)
    if mask is not None:
        scores.reshape(scores_shape)[...] += mask
    # q carries log2(e) already (base 2) unless a mask keeps the scores in natural units
    softmax_rows_into(scores.reshape(-1, keys_count), 1.0 if _base2(q, mask) else LOG2_E)
    result, out = _attention_output(attrs, (*lead, queries, width), np.float32)
    products = np.empty((heads, queries, width), np.float32)
    batched(scores, pack_slots(by_head(v), panel), products)
    out[...] = products.reshape(out.shape)
    return [result]


def _adds_to(mask: np.ndarray, shape: tuple[int, ...]) -> bool:
    """Whether a float32 ``mask`` broadcasts to ``shape`` without growing it."""
    try:
        return mask.dtype == np.float32 and np.broadcast_shapes(shape, mask.shape) == shape
    except ValueError:
        return False


for _kernel in (
    attention_jit,
    attention_jit_per_head,
    attention_gemm_per_head,
    attention_gemm_heads,
    attention_gemm_heads8,
):
    _kernel.jit = True  # type: ignore[attr-defined]


def _attention(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    q_shape = shapes[0] if shapes else None
    if q_shape is None or len(q_shape) < 2 or math.prod(q_shape) == 0:
        return []
    # the GEMM's packing is not worth it for a few queries (a decode step's one: 145 us against
    # 17 batched)
    many = q_shape[-2] >= GEMM_MIN_QUERIES
    masked = len(shapes) > 3 and shapes[3] is not None
    heads = [attention_gemm_heads, attention_gemm_heads8] if many else []
    if masked:
        return [attention_jit, *heads]
    gemms = [attention_gemm_per_head, *heads] if many else []
    return [attention_jit, attention_jit_per_head, *gemms]


GEMM_MIN_QUERIES = 16


CANDIDATES = {"FusedAttention": _attention}
