"""One-row products (a decode step's) over weights streamed from memory: W read once, row by
row, in memory order.

A decode step's weights (the GPT step's 109 MB) leave the last-level cache between two runs, so
each of its products streams its matrix from memory.  OpenBLAS's gemv walks several rows of W at
once, each a short stream of N floats, and on narrow outputs the hardware prefetcher follows them
poorly: 2048 -> 512 took 0.30 ms with W out of cache on a Zen 4 core (13 GB/s).
``np.einsum("k,kn->n")`` adds x[k] * W[k, :] to the output one row of W after another (numpy's
vectorised sum-of-products loop): one stream, 0.16 ms.  With W in cache BLAS is about twice as
fast, and on a long output (512 -> 16384: 64 KB, out of L1) einsum loses with W out of cache too,
so the kernel search decides, timing both with the weights out of cache when the plan's weights
are larger than the cache (engine/search.py).  Sums run over k in order, in the weights' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.ops.fused import _one_row_matmul, _row_bias, fused_matmul
from engine.ops.gemm import matmul
from engine.ops.registry import REGISTRY, Kernel

Shapes = Sequence[tuple[int, ...] | None]


def _one_row(a: np.ndarray, w: np.ndarray) -> bool:
    """One input row against a C-contiguous 2-D float matrix of the same dtype."""
    return (
        a.size == a.shape[-1] > 0
        and w.ndim == 2
        and w.shape[0] == a.shape[-1]
        and w.flags.c_contiguous
        and a.dtype == w.dtype
        and a.dtype.kind == "f"
    )


def _streamed(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ W for a 1-D x."""
    return np.einsum("k,kn->n", x, w)


def matmul_streamed(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """MatMul of one row by a fixed matrix, W streamed row by row; other shapes as ``matmul``."""
    a, w = inputs[0], inputs[1]
    if a is None or w is None or not _one_row(a, w):
        return matmul(inputs, attrs)
    return [_streamed(a.reshape(-1), w).reshape((*a.shape[:-1], w.shape[1]))]


def fused_matmul_streamed(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedMatMul (bias, activation) of one row by a fixed matrix, W streamed row by row;
    other shapes as ``fused_matmul``."""
    a, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if a is None or w is None or not _one_row(a, w) or not _row_bias(bias, w.shape[1]):
        return fused_matmul(inputs, attrs)
    return [_one_row_matmul(a, w, bias, attrs, _streamed)]


STREAMED: dict[str, Kernel] = {"MatMul": matmul_streamed, "FusedMatMul": fused_matmul_streamed}


def candidates(op: str) -> Callable[[dict[str, Any], Shapes], list[Kernel]]:
    """A provider for engine.kernels.NUMPY: ``op``'s registered kernel and, for one input row by
    a 2-D matrix, its streamed twin beside it."""

    def provider(attrs: dict[str, Any], shapes: Shapes) -> list[Kernel]:
        a, w = (shapes[0], shapes[1]) if len(shapes) > 1 else (None, None)
        if a is None or w is None or len(a) == 0 or len(w) != 2 or math.prod(a[:-1]) != 1:
            return [REGISTRY[op]]
        return [REGISTRY[op], STREAMED[op]]

    return provider
