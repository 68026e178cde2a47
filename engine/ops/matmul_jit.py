"""MatMul and FusedMatMul with constant 2-D weights on the JIT GEMM (conv/gemm_jit.py).

numpy's matmul hands OpenBLAS the weights on every call, and OpenBLAS packs them again each
time; then FusedMatMul adds the bias in a second pass over the output.  Here the plan packs the
weights once into the micro-kernel's panels (``pack``), and the bias, Relu or Clip are applied
to each output tile while it is in L1.  A UNet's projections are this shape: a [2048, 64] by
[64, 512] feed-forward took ~0.8x numpy's time, its [2048, 64] by [64, 64] q, k, v ones
~0.7-0.8x.  An exact GELU runs after the product as rows_jit's JIT pass (two passes per row in
L1, against numpy's 17 over the whole output: ViT's [197, 192] by [192, 768] feed-forward
0.43 -> 0.29 ms, BERT's [128, 384] by [384, 1536] 0.99 -> 0.77); other activations as numpy's
kernel runs them.
Under engine/team.py's worker (a 2-thread run with several wide products) the GEMM's tiles are
shared with it as a conv's are.  Otherwise, with two threads, it is also offered shared out
(``fused_matmul_shared_jit``): row chunks the caller and a pool thread take in turn, each
serial, so a pool thread parked by a busy machine delays one chunk, not the node (numba's
prange and OpenBLAS split statically and wait for it: on the loaded 2-core host BERT's
[128, 384] by [384, 1152] took 0.63 ms by prange, 0.57 shared, OpenBLAS's median 4.1 ms against
its best 0.52).
Each kernel comes in two widths, as the convs' GEMMs do: gemm_jit's 6 x 32 tiles (AVX-512's
32 registers) and gemm8_jit's 6 x 16 ones (``*_gemm8_jit``: an AVX2 core's 16 registers, where
the 6 x 32 tile spills: ViT-Tiny's [197, 192] by [192, 576] took 2.1x OpenBLAS's time on
it); the search keeps the device's fastest.  The packed weights say which width they are for.
Offered only where the weights are fixed for the plan (the search's ``_packable``); the sums
run over K in order with fused multiply-adds, so results differ from OpenBLAS's by float32
rounding only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine import jit, team
from engine.batch_split import share_out
from engine.ops.conv import gemm8_jit
from engine.ops.conv.common import fused_bounds
from engine.ops.conv.gemm_jit import MR, NR, gemm, pack_panels, packed_shape
from engine.ops.fused import apply_activation, fused_matmul
from engine.ops.registry import REGISTRY, Kernel
from engine.ops.rows_jit import exact_gelu, gelu_rows_into

MIN_ROWS = 16  # fewer rows (a decode step): the GEMV paths win, and a tile is 6 rows


def _weights(w: np.ndarray, width: int) -> tuple[np.ndarray, int, Any] | None:
    """(packed panels, M, the GEMM for them) from the plan's packed weights (of either width)
    or raw (K, M) float32 ones, packed ``width`` wide."""
    if w.dtype != np.float32 or w.ndim not in (2, 3):
        return None
    if w.ndim == 2:
        w = pack_panels(w) if width == NR else gemm8_jit.pack_panels16(w)
    if w.shape[2] == NR:
        return w, packed_shape(w)[1], gemm
    return (w, gemm8_jit.packed_shape16(w)[1], gemm8_jit.gemm16) if w.shape[2] == gemm8_jit.NR else None


def _product(
    a: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    attrs: dict[str, Any],
    shared: bool = False,
    width: int = NR,
) -> np.ndarray | None:
    """a @ W (+ bias, Relu / Clip in the tiles, other activations after); None: not this
    kernel's inputs (the caller falls back).  ``shared``: in row chunks the calling thread and
    a pool thread take in turn (``_shared_rows``), when the session allows two threads.
    ``width``: the panels' width, where W comes unpacked."""
    weights = _weights(w, width)
    if weights is None or a.dtype != np.float32 or a.ndim < 2 or a.size == 0:
        return None
    packed, m, product = weights
    depth = packed.shape[1] - 2
    if a.shape[-1] != depth or (bias is not None and (bias.dtype != np.float32 or bias.ndim != 1)):
        return None
    if bias is not None and bias.shape[0] % m:
        return None
    rows = np.ascontiguousarray(a).reshape(-1, depth)
    out = np.empty((rows.shape[0], m), np.float32)
    bounds = fused_bounds(attrs)
    activation = attrs.get("activation")
    gelu = bounds is None and activation == "Gelu" and exact_gelu(attrs)
    vector = None if bias is None else bias[:m]  # a tiled bias: one copy

    def chunk(first: int, last: int) -> None:
        product(rows[first:last], packed, out[first:last], vector, bounds=bounds)
        if gelu:
            gelu_rows_into(out[first:last], None)  # out is fresh, C-contiguous float32

    threads = jit.threads()
    if shared and threads > 1 and rows.shape[0] >= SHARED_MIN_ROWS and team.active() is None:
        _shared_rows(chunk, rows.shape[0], threads)
    else:
        chunk(0, rows.shape[0])
    y = out.reshape((*a.shape[:-1], m))
    return y if bounds is not None or gelu or activation is None else apply_activation(y, attrs)


# Rows from which a two-thread session's GEMM is shared out in chunks (below, the hand-off to a
# pool thread, ~20-50 us, is not worth it); chunks per thread, so that a pool thread the
# scheduler parks on a busy machine holds up at most one chunk: the caller takes the rest.
SHARED_MIN_ROWS = 8 * MR
CHUNKS_PER_THREAD = 2


def _shared_rows(chunk: Any, rows: int, threads: int) -> None:
    """``chunk(first, last)`` over [0, rows) in CHUNKS_PER_THREAD * threads pieces of whole
    tiles, each on one thread with serial JIT kernels (numba's prange splits statically and
    waits for a parked thread's share; BLAS's threads likewise)."""
    parts = CHUNKS_PER_THREAD * threads
    step = max(MR, -(-rows // parts // MR) * MR)
    bounds = [(first, min(rows, first + step)) for first in range(0, rows, step)]

    def one(span: tuple[int, int]) -> None:
        with jit.thread_limit(1):
            chunk(*span)

    share_out(one, bounds, threads)


def fused_matmul_gemm_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedMatMul (A @ W + bias, then the activation) with W packed for the JIT GEMM."""
    bias = inputs[2] if len(inputs) > 2 else None
    y = _product(inputs[0], inputs[1], bias, attrs)
    if y is None:
        return fused_matmul(_unpacked(inputs), attrs)
    return [y]


def fused_matmul_shared_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedMatMul as ``fused_matmul_gemm_jit``, its rows shared out between the session's
    threads in chunks the caller also takes (offered only where two threads are allowed)."""
    bias = inputs[2] if len(inputs) > 2 else None
    y = _product(inputs[0], inputs[1], bias, attrs, shared=True)
    if y is None:
        return fused_matmul(_unpacked(inputs), attrs)
    return [y]


def matmul_gemm_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """MatMul A @ W with W packed for the JIT GEMM."""
    y = _product(inputs[0], inputs[1], None, {})
    return [y] if y is not None else REGISTRY["MatMul"](_unpacked(inputs), attrs)


def fused_matmul_gemm8_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``fused_matmul_gemm_jit`` on 6 x 16 tiles (AVX2), W packed for them."""
    bias = inputs[2] if len(inputs) > 2 else None
    y = _product(inputs[0], inputs[1], bias, attrs, width=gemm8_jit.NR)
    return [y] if y is not None else fused_matmul(_unpacked(inputs), attrs)


def fused_matmul_shared8_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``fused_matmul_shared_jit`` on 6 x 16 tiles (AVX2), W packed for them."""
    bias = inputs[2] if len(inputs) > 2 else None
    y = _product(inputs[0], inputs[1], bias, attrs, shared=True, width=gemm8_jit.NR)
    return [y] if y is not None else fused_matmul(_unpacked(inputs), attrs)


def matmul_gemm8_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``matmul_gemm_jit`` on 6 x 16 tiles (AVX2), W packed for them."""
    y = _product(inputs[0], inputs[1], None, {}, width=gemm8_jit.NR)
    return [y] if y is not None else REGISTRY["MatMul"](_unpacked(inputs), attrs)


def _unpacked(inputs: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """The inputs with packed weights (either width) turned back into (K, M) (a fallback's
    rare path)."""
    w = inputs[1]
    if w is None or w.ndim != 3:
        return inputs
    depth, m = packed_shape(w) if w.shape[2] == NR else gemm8_jit.packed_shape16(w)
    matrix = w[:, :depth].transpose(1, 0, 2).reshape(depth, -1)[:, :m]
    return [inputs[0], np.ascontiguousarray(matrix), *inputs[2:]]


def _packer(pack: Any) -> Any:
    """A kernel's ``pack``: its panels of fixed float32 (K, M) weights."""

    def packed(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> dict[int, np.ndarray]:
        w = inputs[1]
        return {1: pack(np.asarray(w))} if w is not None and w.ndim == 2 and w.dtype == np.float32 else {}

    return packed


for _kernels, _pack in (
    ((fused_matmul_gemm_jit, fused_matmul_shared_jit, matmul_gemm_jit), pack_panels),
    ((fused_matmul_gemm8_jit, fused_matmul_shared8_jit, matmul_gemm8_jit), gemm8_jit.pack_panels16),
):
    for _kernel in _kernels:
        _kernel.jit = True  # type: ignore[attr-defined]
        _kernel.pack = _packer(_pack)  # type: ignore[attr-defined]


def _offered(shapes: Sequence[tuple[int, ...] | None]) -> bool:
    """A 2-D weight and at least MIN_ROWS rows of A."""
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None or len(shapes[1]) != 2:
        return False
    a = shapes[0]
    return len(a) >= 2 and a[-1] == shapes[1][0] and math.prod(a[:-1]) >= MIN_ROWS


def _fused_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    """The JIT GEMM; and shared out in row chunks when the search runs with two or more threads
    (a ``jit.thread_limit``: the plan is built under the session's) and without the team (whose
    worker takes the GEMM's tiles itself)."""
    if not _offered(shapes):
        return []
    rows = math.prod(shapes[0][:-1]) if shapes[0] else 0
    shared = jit.threads() > 1 and rows >= SHARED_MIN_ROWS and team.active() is None
    tiled = [fused_matmul_gemm_jit, fused_matmul_gemm8_jit]
    return [*tiled, fused_matmul_shared_jit, fused_matmul_shared8_jit] if shared else tiled


def _matmul_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    return [matmul_gemm_jit, matmul_gemm8_jit] if _offered(shapes) else []


CANDIDATES = {"FusedMatMul": _fused_candidates, "MatMul": _matmul_candidates}
