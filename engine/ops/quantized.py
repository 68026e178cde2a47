"""Quantized tensors: QuantizeLinear / DequantizeLinear (per tensor, per axis, block-wise), and
the fused QGather / QMatMul the converter emits for quantized weights.

Packed 4-bit tensors.  numpy has no int4, so the converter stores int4/uint4 values two per
byte (low nibble first) in a uint8 tensor and gives the node ``packed`` ("int4" or
"uint4") and ``shape`` (the logical shape of ``x``).  A packed zero point uses the same
packing, with the logical shape of the scale.  Otherwise the ONNX opset-21 semantics hold:
``y = (x - zero_point) * scale``, with ``scale`` a scalar (per tensor), 1-D along ``axis``
(per axis) or, when ``block_size`` > 0, the shape of ``x`` with ``axis`` divided into
blocks of ``block_size`` (the last block may be shorter).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.fused import ACTIVATIONS, apply_activation
from engine.ops.registry import check, register
from engine.ops.scratch import scratch

# Ops only the converter writes (not ONNX operators a user model may contain).
INTERNAL_OPS = frozenset({"QGather", "QMatMul"})
PACKED_TYPES = ("int4", "uint4")
# QMatMul casts this many bytes' worth of weight rows to float at a time, into one reused
# buffer, so the whole float matrix never exists.  Measured on the GPT decode step (1 thread,
# M=1, 25 int8 matmuls): numpy's per-call overhead makes small blocks slow (128 KB: 8.4 ms,
# 1 MB: 5.3 ms, 4 MB: 4.4 ms), while a whole 32 MB matrix at once falls out of cache (5.3 ms).
# Re-measured after an onnxruntime run (cold weights): 2 MB costs 0.15-0.3 ms more than 4 MB,
# 8 MB 0.3 ms more; the int8 -> float32 cast (~0.1 ns per weight) is 2/3 of the time.
SCRATCH_BYTES = 4 << 20
_FLOAT32 = np.dtype(np.float32)


def unpack4(packed: np.ndarray, shape: list[int], signed: bool) -> np.ndarray:
    """Two 4-bit values per byte, low nibble first -> int8 array of ``shape``.

    Each byte widens to a little-endian uint16 holding its two nibbles in its two bytes,
    (b | b << 4) & 0x0F0F: three whole-array integer operations instead of two strided
    writes, about twice as fast.
    """
    flat = np.asarray(packed, dtype=np.uint8).reshape(-1)
    count = math.prod(shape)
    if flat.size != (count + 1) // 2:
        raise ValueError(f"packed 4-bit tensor has {flat.size} bytes, shape {shape} needs {(count + 1) // 2}")
    wide = flat.astype("<u2")
    wide |= wide << np.uint16(4)
    wide &= np.uint16(0x0F0F)
    out = wide.view(np.int8)[:count]
    if signed:  # 8..15 are -8..-1
        out ^= np.int8(8)
        out -= np.int8(8)
    return out.reshape(shape)


def _check_dequantize(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    activation = attrs.get("activation")
    if activation is not None and activation not in ACTIVATIONS:
        return f"fused activation {activation!r} is not one of {ACTIVATIONS}"
    packed = attrs.get("packed")
    if packed is not None and packed not in PACKED_TYPES:
        return f"DequantizeLinear packed={packed!r} is not one of {PACKED_TYPES}"
    if packed is not None and not isinstance(attrs.get("shape"), list):
        return "DequantizeLinear with packed 4-bit input needs its logical shape in attribute 'shape'"
    if int(attrs.get("block_size", 0)) < 0:
        return "DequantizeLinear block_size must be >= 0"
    return None


check("DequantizeLinear", "QMatMul", "QGather")(_check_dequantize)


def _values(x: np.ndarray, zero: np.ndarray | None, scale: np.ndarray, attrs: dict[str, Any]):
    """The integer values and zero point as arrays (unpacked if stored two per byte)."""
    packed = attrs.get("packed")
    if packed is not None:
        signed = packed == "int4"
        x = unpack4(x, list(attrs["shape"]), signed)
        if zero is not None:
            zero = unpack4(zero, list(scale.shape), signed)
    return x, zero


def _expand(param: np.ndarray, x_shape: tuple[int, ...], attrs: dict[str, Any]) -> np.ndarray:
    """Broadcast a scale / zero point to x's shape (per tensor, per axis or block-wise)."""
    block = int(attrs.get("block_size", 0))
    if block == 0 and param.size == 1:
        return param.reshape(())
    axis = normalize_axis(int(attrs.get("axis", 1)), len(x_shape))
    if block > 0:
        repeated = np.repeat(param, block, axis=axis)
        return np.take(repeated, np.arange(x_shape[axis]), axis=axis)
    shape = [1] * len(x_shape)
    shape[axis] = param.size
    return param.reshape(shape)


def dequantize(
    x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, attrs: dict[str, Any]
) -> np.ndarray:
    """(x - zero_point) * scale in the scale's float type."""
    x, zero = _values(x, zero, scale, attrs)
    return _dequantize_values(x, scale, zero, attrs, _float_type(scale))


def _float_type(scale: np.ndarray) -> np.dtype:
    return scale.dtype if scale.dtype.kind == "f" else np.dtype(np.float32)


@register("QuantizeLinear")
def quantize_linear(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """saturate(round_half_even(x / scale) + zero_point), to the zero point's type (uint8 without
    one); per tensor, per axis or block-wise like DequantizeLinear."""
    x, scale = inputs[0], inputs[1]
    zero = inputs[2] if len(inputs) > 2 else None
    dtype = zero.dtype if zero is not None else np.dtype(np.uint8)
    if dtype.kind not in "iu" or dtype.itemsize > 2:
        raise ValueError(f"QuantizeLinear to {dtype} is not supported (int8, uint8, int16, uint16)")
    info = np.iinfo(dtype)
    values = np.rint(x / _expand(scale.astype(np.float32, copy=False), x.shape, attrs))
    if zero is not None:
        values += _expand(zero, x.shape, attrs).astype(np.float32)
    return [np.clip(values, info.min, info.max).astype(dtype)]


@register("DequantizeLinear")
def dequantize_linear(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale = inputs[0], inputs[1]
    zero = inputs[2] if len(inputs) > 2 else None
    return [dequantize(x, scale, zero, attrs)]


def _rows(x: np.ndarray, rows: np.ndarray | slice, attrs: dict[str, Any]) -> np.ndarray:
    """Some rows of a 2-D quantized weight as integers, unpacking only those rows when it can
    (a packed row is whole bytes when the row length is even)."""
    packed = attrs.get("packed")
    if packed is None:
        return x[rows]
    height, width = attrs["shape"]
    if width % 2:
        return unpack4(x, [height, width], packed == "int4")[rows]
    picked = x.reshape(height, width // 2)[rows]
    return unpack4(picked, [picked.shape[0], width], packed == "int4")


def _zero(zero: np.ndarray | None, scale: np.ndarray, attrs: dict[str, Any]) -> np.ndarray | None:
    if zero is None or attrs.get("packed") is None:
        return zero
    return unpack4(zero, list(scale.shape), attrs["packed"] == "int4")


@register("QGather")
def qgather(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Gather rows (axis 0) of a quantized 2-D table, dequantizing only the rows gathered.

    Inputs: x (quantized table), scale, zero point (or omitted), indices.  The scale is per
    row (axis 0) or block-wise along axis 1, so each row's parameters are its own row.
    """
    x, scale, zero, indices = inputs[0], inputs[1], inputs[2], inputs[3]
    if indices.size == 1 and zero is None and _row_scaled(x, scale, attrs):
        return [_one_qrow(x, scale, indices)]
    height, width = attrs["shape"] if attrs.get("packed") else x.shape
    if indices.size and (indices.min() < -height or indices.max() >= height):
        raise IndexError(f"QGather indices out of range [-{height}, {height - 1}]")
    flat = np.where(indices < 0, indices + height, indices).reshape(-1)
    zero = _zero(zero, scale, attrs)
    picked_scale, picked_zero = scale[flat], None if zero is None else zero[flat]
    block = int(attrs.get("block_size", 0))
    row_attrs = {**attrs, "axis": 1 if block else 0}
    values = _dequantize_values(
        _rows(x, flat, attrs), picked_scale, picked_zero, row_attrs, _float_type(scale)
    )
    return [values.reshape((*indices.shape, width))]


def _row_scaled(x: np.ndarray, scale: np.ndarray, attrs: dict[str, Any]) -> bool:
    """A plain 2-D table with one float scale per row (the converter's int8 embedding)."""
    return (
        "packed" not in attrs
        and not attrs.get("block_size")
        and x.ndim == 2
        and scale.shape == x.shape[:1]
        and scale.dtype.kind == "f"
    )


def _one_qrow(x: np.ndarray, scale: np.ndarray, index: np.ndarray) -> np.ndarray:
    """One row of the table (a decode step's token): a view, cast, times its scale."""
    i = int(index.reshape(-1)[0])
    if not -x.shape[0] <= i < x.shape[0]:
        raise IndexError(f"QGather indices out of range [-{x.shape[0]}, {x.shape[0] - 1}]")
    values = x[i].astype(scale.dtype)
    values *= scale[i]
    return values.reshape((*index.shape, x.shape[1]))


@register("QMatMul")
def qmatmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A @ dequantize(B) (+ bias), casting a few rows of B at a time into a reused float buffer.

    B is 2-D [K, N], quantized per output column (axis 1) or block-wise along K (axis 0).  Per
    column, the scale and zero point are applied to the [M, N] result instead of to B, so
    dequantizing costs one int -> float cast per weight.
    """
    a, x, scale = inputs[0], inputs[1], inputs[2]
    zero = inputs[3] if len(inputs) > 3 else None
    bias = inputs[4] if len(inputs) > 4 else None
    if _plain_int8(a, scale, zero, attrs):
        # the converter's int8 form (and a decode step's hot path): as little Python as possible
        one_row = a.size == a.shape[-1] == x.shape[0] > 0
        if one_row and x.size * 4 <= SCRATCH_BYTES:
            return [_one_row_int8(a, x, scale, bias, attrs)]
        if one_row:  # a vocabulary projection of one token: its rows a few MB at a time
            y = _row_product(a.reshape(-1), x).reshape((*a.shape[:-1], x.shape[1]))
        elif x.size * 4 <= SCRATCH_BYTES:  # the whole weight in one cast
            part = _rows_scratch(x.shape[0], x.shape[1], _FLOAT32)
            np.copyto(part, x, casting="unsafe")
            # one 2-D product: numpy runs a stacked [B, M, K] @ [K, N] as B separate ones
            y = np.matmul(a.reshape(math.prod(a.shape[:-1]), x.shape[0]), part)
            y = y.reshape((*a.shape[:-1], x.shape[1]))
        else:
            y = _cast_matmul(a, x, x.shape[1], _FLOAT32, attrs, None)
        y *= scale
    else:
        y = _general_qmatmul(a, x, scale, zero, attrs)
    if bias is not None:
        y += bias
    return [apply_activation(y, attrs)]


def _one_row_int8(
    a: np.ndarray, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]
) -> np.ndarray:
    """One input row (a decode step): a 1-D dot (BLAS gemv, ~1 us less than matmul's [1, K]
    product) and the scale and bias on 1-D arrays (half the cost of broadcasting them over
    the leading dims of a size-1 batch)."""
    part = _rows_scratch(x.shape[0], x.shape[1], _FLOAT32)
    np.copyto(part, x, casting="unsafe")
    y = np.dot(a.reshape(-1), part)
    y *= scale
    if bias is not None:
        y += bias
    return apply_activation(y, attrs).reshape((*a.shape[:-1], x.shape[1]))


def _row_product(row: np.ndarray, x: np.ndarray) -> np.ndarray:
    """row @ float(x) for a 1-D row and an int [K, N] weight too large for one cast, cast
    SCRATCH_BYTES of rows at a time.  The same BLAS gemv as _cast_matmul's with less Python
    per chunk (the GPT step's vocabulary projection, 8 chunks: 1.36 ms instead of 1.42)."""
    k, n = x.shape
    step = block_rows(k, n, 4)
    buffer = _rows_scratch(step, n, _FLOAT32)
    y = None
    for start in range(0, k, step):
        stop = min(start + step, k)
        part = buffer[: stop - start]
        np.copyto(part, x[start:stop], casting="unsafe")
        product = np.dot(row[start:stop], part)
        y = product if y is None else np.add(y, product, out=y)
    return y


def _plain_int8(a: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, attrs: dict[str, Any]) -> bool:
    """Per output column, float32, no zero point, not packed."""
    return (
        zero is None
        and a.dtype == scale.dtype == np.float32
        and attrs.get("axis", 1) in (1, -1)
        and not attrs.get("block_size")
        and "packed" not in attrs
    )


def _general_qmatmul(
    a: np.ndarray, x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, attrs: dict[str, Any]
) -> np.ndarray:
    zero = _zero(zero, scale, attrs)
    n = attrs["shape"][1] if attrs.get("packed") else x.shape[1]
    block = int(attrs.get("block_size", 0))
    out_type = np.result_type(a.dtype, _float_type(scale))
    if block > 0 and normalize_axis(int(attrs.get("axis", 1)), 2) == 0:
        if math.prod(a.shape[:-1]) < block:
            return _scaled_block_products(a, x, n, out_type, attrs, (scale, zero, block))
        return _cast_matmul(a, x, n, out_type, attrs, (scale, zero, block))
    y = _cast_matmul(a, x, n, out_type, attrs, None)
    # a @ ((x - z) * s) == (a @ x - sum_k(a) * z) * s when z and s are per output column
    if zero is not None:
        y -= a.sum(axis=-1, keepdims=True) * zero.reshape(-1).astype(out_type)
    y *= scale.reshape(-1).astype(out_type, copy=False)
    return y


def _cast_matmul(
    a: np.ndarray,
    x: np.ndarray,
    n: int,
    out_type: np.dtype,
    attrs: dict[str, Any],
    blocks: tuple[np.ndarray, np.ndarray | None, int] | None,
) -> np.ndarray:
    """a @ float(B), B's rows cast (and with ``blocks`` = (scale, zero, block), dequantized)
    SCRATCH_BYTES at a time into this thread's scratch buffer; the result is [..., n]."""
    k = a.shape[-1]
    a2 = a.reshape(math.prod(a.shape[:-1]), k)
    y = np.empty((a2.shape[0], n), dtype=out_type)
    step = block_rows(k, n, out_type.itemsize, blocks[2] if blocks else 1)
    spare = None  # a second [M, N] buffer, for the partial products after the first
    for start in range(0, k, step):
        stop = min(start + step, k)
        part = _rows_scratch(stop - start, n, out_type)
        np.copyto(part, _rows(x, slice(start, stop), attrs), casting="unsafe")
        if blocks:
            _scale_blocks(part, start, *blocks)
        if start == 0:
            np.matmul(a2[:, :stop], part, out=y)
            continue
        spare = np.empty_like(y) if spare is None else spare
        np.matmul(a2[:, start:stop], part, out=spare)
        y += spare
    if k == 0:
        y.fill(0)
    return y.reshape((*a.shape[:-1], n))


def _scaled_block_products(
    a: np.ndarray,
    x: np.ndarray,
    n: int,
    out_type: np.dtype,
    attrs: dict[str, Any],
    blocks: tuple[np.ndarray, np.ndarray | None, int],
) -> np.ndarray:
    """a @ dequantize(B) for B block-wise along K when a has fewer rows (M) than a block:
    y = sum_b (a_b @ q_b) * s_b - sum_b sum(a_b) * z_b * s_b, scaling each block's [M, N]
    product instead of its [block, N] weights, so dequantizing costs only the cast."""
    scale, zero, block = blocks
    k = a.shape[-1]
    a2 = a.reshape(math.prod(a.shape[:-1]), k)
    y = np.zeros((a2.shape[0], n), dtype=out_type)
    scale = scale.astype(out_type, copy=False)
    step = block_rows(k, n, out_type.itemsize, block)
    for start in range(0, k, step):
        stop = min(start + step, k)
        part = _rows_scratch(stop - start, n, out_type)
        np.copyto(part, _rows(x, slice(start, stop), attrs), casting="unsafe")
        whole = start + (stop - start) // block * block
        for lo, hi in ((start, whole), (whole, stop)):  # whole blocks, then a shorter last one
            if hi > lo:
                count = -(-(hi - lo) // block)
                length = (hi - lo) // count
                rows = a2[:, lo:hi].reshape(a2.shape[0], count, length).transpose(1, 0, 2)
                products = np.matmul(rows, part[lo - start : hi - start].reshape(count, length, n))
                products *= scale[lo // block : lo // block + count, None, :]
                y += products.sum(axis=0)
    if zero is not None and k:
        sums = np.add.reduceat(a2, np.arange(0, k, block), axis=1)
        y -= sums @ (zero.astype(out_type) * scale)
    return y.reshape((*a.shape[:-1], n))


def block_rows(k: int, n: int, itemsize: int, multiple: int = 1) -> int:
    """How many rows of a [k, n] weight QMatMul casts at once: SCRATCH_BYTES' worth, a
    multiple of ``multiple`` (the quantization block), at least one."""
    rows = max(1, SCRATCH_BYTES // max(1, n * itemsize))
    return min(max(k, 1), max(multiple, rows // multiple * multiple))


def _rows_scratch(rows: int, cols: int, dtype: np.dtype) -> np.ndarray:
    """A [rows, cols] view of this thread's reusable cast buffer (engine.ops.scratch): casting
    into it needs no fresh allocation, whose page faults would cost as much as the cast."""
    return scratch("qmatmul.rows", (rows, cols), dtype)


def _scale_blocks(
    part: np.ndarray, start: int, scale: np.ndarray, zero: np.ndarray | None, block: int
) -> None:
    """(part - zero) * scale in place, for rows start.. of a weight with blocks along axis 0.
    ``start`` is a multiple of ``block``; the last block may be shorter."""
    first, rows = start // block, part.shape[0]
    whole = rows // block
    for lo, hi, count in ((0, whole * block, whole), (whole * block, rows, 1)):
        if hi == lo:
            continue
        view = part[lo:hi].reshape(count, (hi - lo) // count, part.shape[1])
        index = slice(first + lo // block, first + lo // block + count)
        if zero is not None:
            view -= zero[index, None, :].astype(part.dtype)
        view *= scale[index, None, :].astype(part.dtype, copy=False)


def _dequantize_values(
    x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, attrs: dict[str, Any], dtype: np.dtype
) -> np.ndarray:
    values = x.astype(dtype)
    if zero is not None:
        values -= _expand(zero, x.shape, attrs).astype(dtype)
    values *= _expand(scale.astype(dtype, copy=False), x.shape, attrs)
    return values
