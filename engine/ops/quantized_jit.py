"""int8 GEMV as a JIT kernel (numba): the twin of quantized.py's one-row QMatMul.

numpy can only multiply floats, so its int8 QMatMul casts the weight rows to float32 (a scratch
four times the weights' size, written and read again) before BLAS's gemv.  Here the weights are
read once as int8: each block of output columns accumulates a[k] * float(W[k, block]) over
every k (four rows per pass, so the accumulators are loaded and stored a quarter as often: 2x
faster) in float32, then scales, adds the bias and stores.  The widening and multiply-adds
vectorise; only the memory traffic of the int8 matrix remains, a quarter of the float one.
No fastmath: results match the cast-and-gemv form to float32 rounding of a K-term sum (in
another order, as BLAS's own blocking is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.ops.fused import apply_activation
from engine.ops.quantized import _plain_int8, qmatmul
from engine.ops.registry import Kernel

BLOCK = 256  # output columns per block: 1 KB of float32 accumulators, in L1 beside the rows read

_F32, _BOOL, _I64 = types.float32, types.boolean, types.int64
_GEMV = types.void(
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(types.int8, 2, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    _BOOL,
    jit.array(_F32, 1, "C"),
)


@jit.njit([types.void(*_GEMV.args, _I64)])
def _block(a, w, scale, bias, has_bias, out, start):  # noqa: ANN001, ANN202
    stop = min(start + BLOCK, w.shape[1])
    width = stop - start
    acc = np.zeros(BLOCK, np.float32)
    depth = w.shape[0]
    whole = depth - depth % 4
    # four weight rows per pass over the accumulators: a quarter of their loads and stores
    for k in range(0, whole, 4):
        a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        r0, r1, r2, r3 = w[k, start:stop], w[k + 1, start:stop], w[k + 2, start:stop], w[k + 3, start:stop]
        for j in range(width):
            acc[j] += (a0 * np.float32(r0[j]) + a1 * np.float32(r1[j])) + (
                a2 * np.float32(r2[j]) + a3 * np.float32(r3[j])
            )
    for k in range(whole, depth):
        ak = a[k]
        row = w[k, start:stop]
        for j in range(width):
            acc[j] += ak * np.float32(row[j])
    result = out[start:stop]
    scales = scale[start:stop]
    if has_bias:
        offsets = bias[start:stop]
        for j in range(width):
            result[j] = acc[j] * scales[j] + offsets[j]
    else:
        for j in range(width):
            result[j] = acc[j] * scales[j]


@jit.njit([_GEMV])
def _gemv_serial(a, w, scale, bias, has_bias, out):  # noqa: ANN001, ANN202
    for block in range((w.shape[1] + BLOCK - 1) // BLOCK):
        _block(a, w, scale, bias, has_bias, out, block * BLOCK)


@jit.njit([_GEMV], parallel=True)
def _gemv_parallel(a, w, scale, bias, has_bias, out):  # noqa: ANN001, ANN202
    for block in prange((w.shape[1] + BLOCK - 1) // BLOCK):
        _block(a, w, scale, bias, has_bias, out, block * BLOCK)


def qmatmul_gemv_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """QMatMul of one float32 row by int8 weights [K, N] with per-column scales (the
    converter's int8 form; a decode step's projections), + bias, then the activation."""
    a, x, scale = inputs[0], inputs[1], inputs[2]
    zero = inputs[3] if len(inputs) > 3 else None
    bias = inputs[4] if len(inputs) > 4 else None
    one_row = x.ndim == 2 and a.size == a.shape[-1] == x.shape[0] > 0
    if not (one_row and x.dtype == np.int8 and _plain_int8(a, scale, zero, attrs)):
        return qmatmul(inputs, attrs)
    n = x.shape[1]
    vector = scale.reshape(-1)
    if vector.shape != (n,) or (bias is not None and (bias.shape != (n,) or bias.dtype != np.float32)):
        return qmatmul(inputs, attrs)
    out = np.empty(n, np.float32)
    has_bias = bias is not None
    row = np.ascontiguousarray(a.reshape(-1))
    weights, vector = np.ascontiguousarray(x), np.ascontiguousarray(vector)
    jit.run(_gemv_serial, _gemv_parallel, row, weights, vector, bias if has_bias else vector, has_bias, out)
    return [apply_activation(out, attrs).reshape((*a.shape[:-1], n))]


qmatmul_gemv_jit.jit = True  # type: ignore[attr-defined]


def _qmatmul(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    a_shape, x_shape = shapes[0], shapes[1] if len(shapes) > 1 else None
    if a_shape is None or x_shape is None or len(x_shape) != 2 or not a_shape:
        return []
    rows = int(np.prod(a_shape[:-1], dtype=np.int64))
    return [qmatmul_gemv_jit] if rows == 1 and a_shape[-1] == x_shape[0] else []


CANDIDATES = {"QMatMul": _qmatmul}
