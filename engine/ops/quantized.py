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

from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.fused import ACTIVATIONS, apply_activation
from engine.ops.registry import check, register

# Ops only the converter writes (not ONNX operators a user model may contain).
INTERNAL_OPS = frozenset({"QGather", "QMatMul"})
PACKED_TYPES = ("int4", "uint4")
# QMatMul dequantizes this many rows of the weight at a time: 256 rows x a few thousand
# columns of float32 stays within a typical L2 cache, and the whole float matrix never exists.
QMATMUL_ROWS = 256


def unpack4(packed: np.ndarray, shape: list[int], signed: bool) -> np.ndarray:
    """Two 4-bit values per byte, low nibble first -> int8 array of ``shape``."""
    flat = np.asarray(packed, dtype=np.uint8).reshape(-1)
    count = int(np.prod(shape, dtype=np.int64))
    if flat.size != (count + 1) // 2:
        raise ValueError(f"packed 4-bit tensor has {flat.size} bytes, shape {shape} needs {(count + 1) // 2}")
    out = np.empty(flat.size * 2, dtype=np.int8)
    out[0::2] = flat & 0x0F
    out[1::2] = flat >> 4
    out = out[:count]
    if signed:
        out = np.where(out >= 8, out - 16, out).astype(np.int8)
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


@register("QMatMul")
def qmatmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A @ dequantize(B) (+ bias), dequantizing QMATMUL_ROWS rows of B at a time.

    B is 2-D [K, N], quantized per output column (axis 1) or block-wise along K (axis 0).
    """
    a, x, scale = inputs[0], inputs[1], inputs[2]
    zero = _zero(inputs[3] if len(inputs) > 3 else None, scale, attrs)
    bias = inputs[4] if len(inputs) > 4 else None
    k, n = attrs["shape"] if attrs.get("packed") else x.shape
    axis = normalize_axis(int(attrs.get("axis", 1)), 2)
    block = int(attrs.get("block_size", 0))
    blocked = axis == 0 and block > 0
    step = max(block, QMATMUL_ROWS // block * block) if blocked else QMATMUL_ROWS
    dtype = _float_type(scale)
    y = np.zeros((*a.shape[:-1], n), dtype=np.result_type(a.dtype, dtype))
    for start in range(0, k, step):
        stop = min(start + step, k)
        rows = _rows(x, slice(start, stop), attrs)
        if blocked:
            blocks = slice(start // block, -(-stop // block))
            part_zero = None if zero is None else zero[blocks]
            part = _dequantize_values(rows, scale[blocks], part_zero, attrs, dtype)
        else:
            part = rows.astype(dtype)  # per-column scale and zero point: applied once, below
        y += a[..., start:stop] @ part
    if not blocked:
        # a @ ((x - z) * s) == (a @ x - sum_k(a) * z) * s when z and s are per output column
        if zero is not None:
            y -= a.sum(axis=-1, keepdims=True) * zero.reshape(-1).astype(dtype)
        y *= scale.reshape(-1).astype(dtype, copy=False)
    if bias is not None:
        y += bias
    return [apply_activation(y, attrs)]


def _dequantize_values(
    x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, attrs: dict[str, Any], dtype: np.dtype
) -> np.ndarray:
    values = x.astype(dtype)
    if zero is not None:
        values -= _expand(zero, x.shape, attrs).astype(dtype)
    values *= _expand(scale.astype(dtype, copy=False), x.shape, attrs)
    return values
