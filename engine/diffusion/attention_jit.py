"""FusedAttention for many tokens and narrow heads, a JIT kernel (numba): a UNet's self-attention
at 32x32 latents is 1024 queries over 1024 keys in heads of 8-40 channels.

The other kernels (engine/ops/fused.py, engine/ops/attention_jit.py) compute each head's whole
[S, T] score matrix with BLAS (4 MiB at 1024 tokens: out of L2), soften it, and multiply it by v
with BLAS again; with 8-wide heads both products are memory-bound GEMMs of inner size 8 or an
output 8 wide, and at two threads every one of those BLAS calls waits for the other thread.
Here a block of query rows at a time goes through the scores, the softmax and the product with
v while its rows sit in L1 (flash attention without the running max: a row of 1024 scores fits,
so its exact max is taken first).  q k^T accumulates over the head's channels along contiguous
rows of k^T (vectorised over keys; for heads 8, 16 or 40 wide each score is summed in a register
with the channel loop unrolled, ~0.6x the time at 8-wide heads); 2^x is exp_jit's polynomial;
p v is eight-lane dot products along rows of v^T.  The (head, block) items run in parallel
(prange) when the session allows two threads, one launch per node.  Without a mask (the scores
are base 2: q carries log2(e)), float32 only; anything else takes the batched numpy kernel.  No
fastmath.  Heads 8 or 16 wide (q's and v's) take attention_tile_jit.py's register kernel
instead, 16 query rows a tile (~0.45x this kernel's time at 1024 tokens, 8-wide heads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.diffusion.attention_tile_jit import TILE, WIDTHS, micro8, micro16
from engine.diffusion.flash import shape_fits
from engine.ops.exp_jit import exp2_row
from engine.ops.fused import _attention_inputs, _attention_output, fused_attention, view_layout
from engine.ops.registry import Kernel

BLOCK = 64  # query rows per work item: the scores of a block, [T, 64], stay in L2

_F32 = types.float32
_IN3 = jit.array(_F32, 3, "C", readonly=True)
_IN4 = jit.array(_F32, 4, "C", readonly=True)
_OUT3 = jit.array(_F32, 3, "C")
_ROW = jit.array(_F32, 1, "C")
_BITS = jit.array(types.int32, 1, "C")
# q as [H, S / BLOCK, D, BLOCK] (a block's rows side by side), k [H, T, D], v [H, T, Dv], out
# [H, S, Dv]; then the work items [first, last) (item = head * S / BLOCK + block)
_SIGNATURE = types.void(_IN4, _IN3, _IN3, _OUT3, types.int64, types.int64)


@jit.njit(
    [
        types.void(
            jit.array(_F32, 2, "C", readonly=True),
            jit.array(_F32, 2, "A", readonly=True),
            _ROW,
            _ROW,
            types.int64,
        )
    ],
    error_model="numpy",
    inline="always",
)
def _scores_fixed(k, qt, scores, top, depth):  # noqa: ANN001, ANN202
    """scores[t, :] = k[t] . qt[:, r] for a depth that is a literal at the (inlined) call: the
    loop over it is then unrolled and the one over the block's rows vectorised, each score
    summed in a register (the general loop above adds into the scores row in memory, a load
    and a store per channel: ~1.4x this one's time at 8-wide heads).  Same order of additions."""
    for t in range(k.shape[0]):
        kt = k[t]
        row = scores[t * BLOCK : (t + 1) * BLOCK]
        for r in range(BLOCK):
            s = np.float32(0)
            for j in range(depth):
                s += kt[j] * qt[j, r]
            row[r] = s
            top[r] = max(top[r], s)


@jit.njit([_SIGNATURE], error_model="numpy")
def _items(q, k, v, out, first, last):  # noqa: ANN001, ANN202
    """Items [first, last), each one (head, block of BLOCK query rows): called for all (one
    thread) or per chunk by ``_parallel``, one compiled body for both (a per-item function was
    compiled apart, then again inside each caller).  Every inner loop runs over the block's
    rows, so LLVM's loop vectoriser takes it (the scores are key-major, [T, BLOCK]): the max,
    the sums and p v accumulate the block's rows at once; no horizontal reduction."""
    size = k.shape[1] * BLOCK
    scores, weights, bits = np.empty(size, np.float32), np.empty(size, np.float32), np.empty(size, np.int32)
    small = np.empty((2 + v.shape[2]) * BLOCK, np.float32)
    for item in range(first, last):
        blocks = q.shape[1]
        h, b = item // blocks, item % blocks
        keys, depth, width = k.shape[1], k.shape[2], v.shape[2]
        qt = q[h, b]
        top, total, acc = small[:BLOCK], small[BLOCK : 2 * BLOCK], small[2 * BLOCK :]
        top[:] = -np.inf
        if depth == 8:  # the common narrow heads, each with the depth a constant (see _scores_fixed)
            _scores_fixed(k[h], qt, scores, top, 8)
        elif depth == 16:
            _scores_fixed(k[h], qt, scores, top, 16)
        elif depth == 40:  # SD-1.5's first level: 320 channels in 8 heads
            _scores_fixed(k[h], qt, scores, top, 40)
        else:
            for t in range(keys):
                row = scores[t * BLOCK : (t + 1) * BLOCK]
                row[:] = 0
                for j in range(depth):
                    kj = k[h, t, j]
                    qj = qt[j]
                    for r in range(BLOCK):
                        row[r] += kj * qj[r]
                for r in range(BLOCK):
                    top[r] = max(top[r], row[r])
        for t in range(keys):
            row = scores[t * BLOCK : (t + 1) * BLOCK]
            for r in range(BLOCK):
                row[r] -= top[r]
        exp2_row(scores, np.float32(1), np.float32(0), weights, bits, keys * BLOCK)
        total[:] = 0
        acc[:] = 0
        for t in range(keys):
            p = weights[t * BLOCK : (t + 1) * BLOCK]
            for r in range(BLOCK):
                total[r] += p[r]
            for j in range(width):
                vj = v[h, t, j]
                into = acc[j * BLOCK : (j + 1) * BLOCK]
                for r in range(BLOCK):
                    into[r] += vj * p[r]
        for r in range(min(BLOCK, out.shape[1] - b * BLOCK)):
            inverse = np.float32(1) / total[r]
            for j in range(width):
                out[h, b * BLOCK + r, j] = acc[j * BLOCK + r] * inverse


@jit.njit([_SIGNATURE], parallel=True, error_model="numpy")
def _parallel(q, k, v, out, first, last):  # noqa: ANN001, ANN202
    items = last - first
    chunks = 16
    per = (items + chunks - 1) // chunks
    for c in prange(chunks):
        _items(q, k, v, out, first + min(c * per, items), first + min((c + 1) * per, items))


@jit.njit([_SIGNATURE], error_model="numpy")
def _tile_items(q, k, v, out, first, last):  # noqa: ANN001, ANN202
    """Items [first, last), each one (head, tile of 16 query rows) through attention_tile_jit's
    register kernel: all of them (one thread), or a chunk for ``_tiles_parallel``."""
    scores, tile = np.empty(k.shape[1] * TILE, np.float32), np.empty(v.shape[2] * TILE, np.float32)
    blocks = q.shape[1]
    keys, depth, width = k.shape[1], k.shape[2], v.shape[2]
    for item in range(first, last):
        h, b = item // blocks, item % blocks
        at = item * depth * TILE
        if depth == 8:
            micro8(q, at, k, h * keys * depth, v, h * keys * width, keys, scores, tile)
        else:
            micro16(q, at, k, h * keys * depth, v, h * keys * width, keys, scores, tile)
        for r in range(min(TILE, out.shape[1] - b * TILE)):
            for j in range(width):
                out[h, b * TILE + r, j] = tile[j * TILE + r]


@jit.njit([_SIGNATURE], parallel=True, error_model="numpy")
def _tiles_parallel(q, k, v, out, first, last):  # noqa: ANN001, ANN202
    items = last - first
    chunks = 16
    per = (items + chunks - 1) // chunks
    for c in prange(chunks):
        _tile_items(q, k, v, out, first + min(c * per, items), first + min((c + 1) * per, items))


def _heads(a: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    """[..., X, Y] broadcast to the heads, as one C-contiguous [heads, X, Y]."""
    a = np.broadcast_to(a, (*lead, *a.shape[-2:]))
    return np.ascontiguousarray(a, np.float32).reshape(-1, *a.shape[-2:])


def _query_blocks(q: np.ndarray, block: int) -> np.ndarray:
    """[H, S, D] -> [H, ceil(S / block), D, block], the rows past S zero (their results dropped)."""
    heads, rows, depth = q.shape
    blocks = -(-rows // block)
    padded = np.zeros((heads, blocks * block, depth), np.float32)
    padded[:, :rows] = q
    return np.ascontiguousarray(padded.reshape(heads, blocks, block, depth).transpose(0, 1, 3, 2))


def flash_attention(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """softmax(q k^T * scale) v with the rows of a block kept in cache (see the module's doc)."""
    q, keys, v, mask = _attention_inputs(inputs, attrs)
    if mask is not None or not (q.dtype == keys.dtype == v.dtype == np.float32) or 0 in q.shape + keys.shape:
        return fused_attention(inputs, attrs)
    lead = np.broadcast_shapes(q.shape[:-2], keys.shape[:-2], v.shape[:-2])
    # 8- and 16-wide heads: the register kernel (attention_tile_jit), 16 rows a tile
    tiles = q.shape[-1] == v.shape[-1] and v.shape[-1] in WIDTHS
    block = TILE if tiles else BLOCK
    heads = (_query_blocks(_heads(q, lead), block), _heads(keys, lead), _heads(v, lead))
    result, out = _attention_output(attrs, (*lead, q.shape[-2], v.shape[-1]), np.float32)
    direct = out.flags.c_contiguous
    target = out if direct else np.empty(out.shape, np.float32)
    kernels = (_tile_items, _tiles_parallel) if tiles else (_items, _parallel)
    items = heads[0].shape[0] * heads[0].shape[1]
    jit.run(*kernels, *heads, target.reshape(-1, *target.shape[-2:]), 0, items)
    if not direct:
        out[...] = target
    return [result]


flash_attention.jit = True  # type: ignore[attr-defined]


def _candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    """Offered for long unmasked attention with narrow heads; the kernel search measures it."""
    views = attrs.get("views") or [None]
    # the views arrive as the load's checked ViewLayouts (prepare_attention), or still as JSON
    q_shape = view_layout(views[0]).shape if views[0] else shapes[0] if shapes else None
    masked = len(shapes) > 3 and shapes[3] is not None
    if masked or q_shape is None or len(q_shape) < 2:
        return []
    return [flash_attention] if shape_fits(q_shape) else []


CANDIDATES = {"FusedAttention": _candidates}
