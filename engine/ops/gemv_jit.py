"""Gemm of one row by fixed weights (a CNN's classifier) as dot products by blocks of outputs (numba).

A CNN's last layer is a GEMV: x (1, K) by B^T, B (N, K) as ONNX's Gemm stores a linear layer
(transB): MobileNetV2's 1280 -> 1000, ResNet18's 512 -> 1000.  numpy hands it to OpenBLAS's
sgemv, which a 2-thread team run (engine/team.py) holds at one thread: 0.28 ms of MobileNetV2's
~7 at 2 threads on the Zen 3 host.  Here blocks of outputs are work items, each output a dot
product over one contiguous row of B, shared with the team's worker (``team.GEMV``) or run on
numba's pool.  The sums are vectorised (reassociation and contraction only: partial sums in
vector lanes, then their total), so they differ from OpenBLAS's by float32 rounding; every
thread runs the same compiled loop, so a shared result is the serial one bit for bit.
Offered beside numpy's Gemm for float32 with alpha = beta = 1, one row of A and B transposed;
the search keeps the faster.  Loaded only with the conv kernels (a model whose heavy ops are
all Gemms stays without numba).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit, team
from engine.ops.gemm import gemm
from engine.ops.registry import Kernel

BLOCK = 16  # outputs per work item: 16 dot products of K, ~1-5 us at a classifier's K

_I64 = types.int64
_IN = jit.array(types.float32, 1, "C", readonly=True)
# x (K), B (N, K), bias (N), out (N); K, N; the items [first, last)
_B = jit.array(types.float32, 2, "C", readonly=True)
_DOTS = types.void(_IN, _B, _IN, jit.array(types.float32, 1, "C"), _I64, _I64, _I64, _I64)
_SUMS = {"reassoc", "contract"}  # partial sums in vector lanes instead of one chain


@jit.njit([_DOTS], error_model="numpy", fastmath=_SUMS)
def _dots(x, b, bias, out, depth, n, first, last):  # noqa: ANN001, ANN202
    """out[j] = x . B[j] + bias[j] for the outputs of items [first, last) (BLOCK each)."""
    for item in range(first, last):
        for j in range(item * BLOCK, min(n, (item + 1) * BLOCK)):
            row = b[j]  # indices from range(): no negative-index wrap to stop vectorising
            total = np.float32(0)
            for k in range(depth):
                total += x[k] * row[k]
            out[j] = total + bias[j]


@jit.njit([_DOTS], parallel=True, error_model="numpy", fastmath=_SUMS)
def _dots_parallel(x, b, bias, out, depth, n, first, last):  # noqa: ANN001, ANN202
    for item in prange(first, last):
        _dots(x, b, bias, out, depth, n, item, item + 1)


def _plain(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> bool:
    """One float32 row of A by a transposed float32 B, alpha = beta = 1, C none or a vector of N."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.dtype != np.float32 or b.dtype != np.float32:
        return False
    if attrs.get("transA", 0) or not attrs.get("transB", 0) or a.shape[0] != 1 or a.shape[1] != b.shape[1]:
        return False
    if float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0:
        return False
    return c is None or (c.dtype == np.float32 and c.shape in ((b.shape[0],), (1, b.shape[0])))


def gemv_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Gemm of one row by B^T as dot products (numpy's Gemm for anything else)."""
    if not _plain(inputs, attrs):
        return gemm(inputs, attrs)
    a, b = inputs[0], inputs[1]
    n, depth = b.shape
    c = inputs[2] if len(inputs) > 2 else None
    bias = np.zeros(n, np.float32) if c is None else np.ascontiguousarray(c).reshape(-1)
    out = np.empty(n, np.float32)
    args = (np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b), bias, out, depth, n)
    items = -(-n // BLOCK)
    team.run(team.GEMV, _dots, _dots_parallel, *args, 0, items, shared=team.worth_sharing(n * depth))
    return [out.reshape(1, n)]


gemv_jit.jit = True  # type: ignore[attr-defined]


def _gemm_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    a, b = (shapes[0], shapes[1]) if len(shapes) > 1 else (None, None)
    if a is None or b is None or len(a) != 2 or len(b) != 2 or a[0] != 1 or attrs.get("transA", 0):
        return []
    return [gemv_jit] if attrs.get("transB", 0) and a[1] == b[1] else []


CANDIDATES = {"Gemm": _gemm_candidates}
