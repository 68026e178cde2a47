"""int8 QMatMul JIT kernels (numba): a GEMV, the twin of quantized.py's one-row QMatMul, and for
several rows BLAS on the cast weights with the scale, bias and GELU in one JIT epilogue.

numpy can only multiply floats, so its int8 QMatMul casts the weight rows to float32 (a scratch
four times the weights' size, written and read again) before BLAS's gemv.  Here the weights are
read once as int8: each block of output columns accumulates a[k] * float(W[k, block]) over
every k (four rows per pass, so the accumulators are loaded and stored a quarter as often: 2x
faster) in float32, then scales, adds the bias and stores.  The widening and multiply-adds
vectorise; only the memory traffic of the int8 matrix remains, a quarter of the float one.
No fastmath: results match the cast-and-gemv form to float32 rounding of a K-term sum (in
another order, as BLAS's own blocking is).

Planned, the GEMV reads its weights packed (``pack_gemv``): [N/BLOCK, K, BLOCK], each column
block's rows one after another.  In [K, N] a block's rows lie N bytes apart (a page each in a
vocabulary projection), and weights coming from memory, as a decode step's do, arrived at a
third of the pace: the GPT step's 25 matrices (27 M weights, cold) 3.22 -> 1.22 ms, against
3.98 for float32 BLAS gemv.  Same sums in the same order: the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.ops import rows_jit
from engine.ops.fused import apply_activation
from engine.ops.quantized import SCRATCH_BYTES, _cast_matmul, _plain_int8, _rows_scratch, qmatmul
from engine.ops.registry import Kernel

BLOCK = 256  # output columns per block: 1 KB of float32 accumulators, in L1 beside the rows read

_F32, _BOOL, _I64 = types.float32, types.boolean, types.int64
# row, weights, scales, bias, has_bias, out, then the blocks of BLOCK columns [first, last)
_GEMV = types.void(
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(types.int8, 2, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    _BOOL,
    jit.array(_F32, 1, "C"),
    _I64,
    _I64,
)


@jit.njit([_GEMV], error_model="numpy")
def _gemv_blocks(a, w, scale, bias, has_bias, out, first, last):  # noqa: ANN001, ANN202
    """Column blocks [first, last): called for all (one thread) or per block by
    ``_gemv_parallel``, one compiled body for both (a per-block function was compiled apart,
    then again inside each caller)."""
    acc = np.empty(BLOCK, np.float32)
    depth = w.shape[0]
    whole = depth - depth % 4
    for block in range(first, last):
        start = block * BLOCK
        stop = min(start + BLOCK, w.shape[1])
        width = stop - start
        acc[:] = 0
        # four weight rows per pass over the accumulators: a quarter of their loads and stores
        for k in range(0, whole, 4):
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            r0, r1, r2, r3 = (
                w[k, start:stop],
                w[k + 1, start:stop],
                w[k + 2, start:stop],
                w[k + 3, start:stop],
            )
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


@jit.njit([_GEMV], parallel=True, error_model="numpy")
def _gemv_parallel(a, w, scale, bias, has_bias, out, first, last):  # noqa: ANN001, ANN202
    for block in prange(first, last):
        _gemv_blocks(a, w, scale, bias, has_bias, out, block, block + 1)


# as _GEMV, the weights packed: [N/BLOCK, K, BLOCK]
_PACKED_GEMV = types.void(_GEMV.args[0], jit.array(types.int8, 3, "C", readonly=True), *_GEMV.args[2:])


@jit.njit([_PACKED_GEMV], error_model="numpy")
def _packed_gemv_blocks(a, packed, scale, bias, has_bias, out, first, last):  # noqa: ANN001, ANN202
    """``_gemv_blocks`` on ``pack_gemv``'s layout: a block's rows are contiguous."""
    acc = np.empty(BLOCK, np.float32)
    depth = packed.shape[1]
    whole = depth - depth % 4
    for block in range(first, last):
        start = block * BLOCK
        width = min(start + BLOCK, out.size) - start
        w = packed[block]
        acc[:] = 0
        for k in range(0, whole, 4):
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            r0, r1, r2, r3 = w[k], w[k + 1], w[k + 2], w[k + 3]
            for j in range(BLOCK):
                acc[j] += (a0 * np.float32(r0[j]) + a1 * np.float32(r1[j])) + (
                    a2 * np.float32(r2[j]) + a3 * np.float32(r3[j])
                )
        for k in range(whole, depth):
            ak = a[k]
            row = w[k]
            for j in range(BLOCK):
                acc[j] += ak * np.float32(row[j])
        if has_bias:
            for j in range(width):
                out[start + j] = acc[j] * scale[start + j] + bias[start + j]
        else:
            for j in range(width):
                out[start + j] = acc[j] * scale[start + j]


@jit.njit([_PACKED_GEMV], parallel=True, error_model="numpy")
def _packed_gemv_parallel(a, packed, scale, bias, has_bias, out, first, last):  # noqa: ANN001, ANN202
    for block in prange(first, last):
        _packed_gemv_blocks(a, packed, scale, bias, has_bias, out, block, block + 1)


def _gemv_operands(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> bool:
    """Whether the GEMV takes this QMatMul: one row, plain int8 weights [K, N] (or packed),
    per-column float32 scales [N], a float32 bias [N] or none."""
    a, x, scale = inputs[0], inputs[1], inputs[2]
    zero = inputs[3] if len(inputs) > 3 else None
    bias = inputs[4] if len(inputs) > 4 else None
    if a is None or x is None or scale is None or x.dtype != np.int8 or x.ndim not in (2, 3):
        return False
    k, n = (x.shape[0], x.shape[1]) if x.ndim == 2 else (x.shape[1], scale.size)
    return (
        a.size == a.shape[-1] == k > 0
        and _plain_int8(a, scale, zero, attrs)
        and scale.size == n
        and (bias is None or (bias.shape == (n,) and bias.dtype == np.float32))
    )


def pack_gemv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> dict[int, np.ndarray]:
    """The int8 weights [K, N] as [N/BLOCK, K, BLOCK], zero-padded (see the module's note)."""
    x = inputs[1]
    if x is None or x.ndim != 2 or not _gemv_operands(inputs, attrs):
        return {}
    k, n = x.shape
    packed = np.zeros((-(-n // BLOCK), k, BLOCK), np.int8)
    for block in range(packed.shape[0]):
        part = x[:, block * BLOCK : (block + 1) * BLOCK]
        packed[block, :, : part.shape[1]] = part
    return {1: packed}


def _unpacked(packed: np.ndarray, n: int) -> np.ndarray:
    return packed.transpose(1, 0, 2).reshape(packed.shape[1], -1)[:, :n]


def qmatmul_gemv_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """QMatMul of one float32 row by int8 weights [K, N] with per-column scales (the
    converter's int8 form; a decode step's projections), + bias, then the activation."""
    a, x, scale = inputs[0], inputs[1], inputs[2]
    bias = inputs[4] if len(inputs) > 4 else None
    if not _gemv_operands(inputs, attrs):
        if x is not None and x.ndim == 3:  # packed for this kernel, then given other operands
            inputs = [inputs[0], _unpacked(x, scale.size), *inputs[2:]]
        return qmatmul(inputs, attrs)
    vector = np.ascontiguousarray(scale.reshape(-1))
    n = vector.size
    out = np.empty(n, np.float32)
    has_bias = bias is not None
    row = np.ascontiguousarray(a.reshape(-1))
    weights = np.ascontiguousarray(x)
    blocks = -(-n // BLOCK)
    packed = x.ndim == 3
    serial = _packed_gemv_blocks if packed else _gemv_blocks
    parallel = _packed_gemv_parallel if packed else _gemv_parallel
    jit.run(
        serial,
        parallel,
        row,
        weights,
        vector,
        bias if has_bias else vector,
        has_bias,
        out,
        0,
        blocks,
    )
    return [apply_activation(out, attrs).reshape((*a.shape[:-1], n))]


# -- several rows (a prompt, an encoder's tokens): BLAS on the cast weights, a JIT epilogue -------

# rows, scales, bias, GELU?, then the rows [first, last)
_EPILOGUE = types.void(
    jit.array(_F32, 2, "C"),
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
    _BOOL,
    _I64,
    _I64,
)


@jit.njit([_EPILOGUE], error_model="numpy")
def _epilogue_rows(y, scale, bias, gelu, first, last):  # noqa: ANN001, ANN202
    """Rows [first, last) of y: called for all (one thread) or per chunk by
    ``_epilogue_parallel``, one compiled body for both."""
    mantissa, bits = np.empty(y.shape[1], np.float32), np.empty(y.shape[1], np.int32)
    for r in range(first, last):
        row = y[r]
        if gelu:  # gelu(row * scale + bias): the scale here, the bias inside the GELU's first pass
            for j in range(row.shape[0]):
                row[j] *= scale[j]
            rows_jit._gelu_row(row, bias, mantissa, bits)
        else:
            for j in range(row.shape[0]):
                row[j] = row[j] * scale[j] + bias[j]


@jit.njit([_EPILOGUE], parallel=True, error_model="numpy")
def _epilogue_parallel(y, scale, bias, gelu, first, last):  # noqa: ANN001, ANN202
    chunks = 8
    per = (last - first + chunks - 1) // chunks
    for c in prange(chunks):
        start = min(last, first + c * per)
        _epilogue_rows(y, scale, bias, gelu, start, min(last, start + per))


def qmatmul_rows_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """QMatMul of several float32 rows by int8 weights [K, N] with per-column scales: numpy's
    cast and BLAS product (quantized.py), then the scale, bias and an exact GELU in one JIT pass
    per row while it is in cache (numpy: a pass each, and an 11-pass GELU)."""
    a, x, scale = inputs[0], inputs[1], inputs[2]
    zero = inputs[3] if len(inputs) > 3 else None
    bias = inputs[4] if len(inputs) > 4 else None
    activation = attrs.get("activation")
    gelu = activation == "Gelu" and (attrs.get("activation_attrs") or {}).get("approximate", "none") == "none"
    n = x.shape[1] if x.ndim == 2 else -1
    plain = x.dtype == np.int8 and _plain_int8(a, scale, zero, attrs) and a.shape[-1] == x.shape[0]
    if not plain or (activation is not None and not gelu) or a.size == a.shape[-1] or scale.size != n:
        return qmatmul(inputs, attrs)
    if bias is not None and (bias.shape != (n,) or bias.dtype != np.float32):
        return qmatmul(inputs, attrs)
    y = _cast_product(a, x)
    rows = y.reshape(-1, n)
    vector = np.ascontiguousarray(scale.reshape(-1))
    jit.run(
        _epilogue_rows,
        _epilogue_parallel,
        rows,
        vector,
        rows_jit._zeros(n) if bias is None else np.ascontiguousarray(bias),
        gelu,
        0,
        rows.shape[0],
    )
    return [y]


def _cast_product(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """a @ float(x), x cast into the reused scratch (whole, or a few MB of rows at a time)."""
    k, n = x.shape
    if x.size * 4 > SCRATCH_BYTES:
        return _cast_matmul(a, x, n, np.dtype(np.float32), {}, None)
    part = _rows_scratch(k, n, np.dtype(np.float32))
    np.copyto(part, x, casting="unsafe")
    # one 2-D product: numpy runs a stacked [B, M, K] @ [K, N] as B separate ones
    return np.matmul(a.reshape(-1, k), part).reshape((*a.shape[:-1], n))


for _kernel in (qmatmul_gemv_jit, qmatmul_rows_jit):
    _kernel.jit = True  # type: ignore[attr-defined]
qmatmul_gemv_jit.pack = pack_gemv  # type: ignore[attr-defined]


def _qmatmul(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    a_shape, x_shape = shapes[0], shapes[1] if len(shapes) > 1 else None
    if a_shape is None or x_shape is None or len(x_shape) != 2 or not a_shape or a_shape[-1] != x_shape[0]:
        return []
    rows = int(np.prod(a_shape[:-1], dtype=np.int64))
    return [qmatmul_gemv_jit] if rows == 1 else [qmatmul_rows_jit] if rows > 1 else []


CANDIDATES = {"QMatMul": _qmatmul}
