"""Helpers shared by kernels: attribute decoding, ONNX dtype codes, input normalisation."""

from __future__ import annotations

from typing import Any

import numpy as np

# TensorProto.DataType codes -> numpy dtypes (the ones numpy can represent natively).
ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
}


def onnx_dtype(code: int) -> np.dtype:
    try:
        return ONNX_DTYPES[int(code)]
    except KeyError:
        raise ValueError(f"ONNX data type {code} is not supported") from None


def tensor_attr(value: dict[str, Any]) -> np.ndarray:
    """Decode a tensor-valued attribute as the converter writes it: {"dtype", "shape", "data"}.

    Non-finite floats travel as the strings "nan", "inf" and "-inf" (JSON has no such numbers).
    """
    dtype = np.dtype(value["dtype"])
    data = value["data"]
    if dtype.kind == "f":
        data = [float(v) for v in data]
    return np.array(data, dtype=dtype).reshape(value["shape"])


def int_list(array: np.ndarray | None) -> list[int] | None:
    """An optional 1-D int tensor input (axes, shape, pads...) as a Python list."""
    if array is None:
        return None
    return [int(v) for v in np.asarray(array).reshape(-1)]


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: list[int], rank: int) -> list[int]:
    out = [normalize_axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axes}")
    return out
