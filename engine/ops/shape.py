"""Shape manipulation and indexing: Reshape, Transpose, Concat, Slice, Gather, Pad..."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.common import int_list, normalize_axes, normalize_axis, tensor_attr
from engine.ops.registry import check, prepare, register

Inputs = list[np.ndarray | None]


def _optional(inputs: Inputs, index: int) -> np.ndarray | None:
    return inputs[index] if len(inputs) > index else None


@register("Identity")
def identity(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    return [inputs[0]]


@register("Dropout")
def dropout(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    """Inference: the data passes through and the mask is all true."""
    x = inputs[0]
    return [x, np.ones(x.shape, dtype=np.bool_)]


@register("Reshape")
def reshape(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, dims = inputs[0], np.asarray(inputs[1])
    # tolist() is a quarter of int_list's cost, and a decode step runs a dozen Reshapes
    shape = dims.reshape(-1).tolist() if dims.dtype.kind in "iu" else int_list(dims)
    if 0 in shape and not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@register("Flatten")
def flatten(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise ValueError(f"Flatten axis {attrs['axis']} is out of range for rank {x.ndim}")
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    cols = int(np.prod(x.shape[axis:], dtype=np.int64))
    return [x.reshape(rows, cols)]


@register("Transpose")
def transpose(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    perm = attrs.get("perm")
    return [np.transpose(x, perm if perm is not None else tuple(reversed(range(x.ndim))))]


@register("Concat")
def concat(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    arrays = [v for v in inputs if v is not None]
    return [np.concatenate(arrays, axis=normalize_axis(int(attrs["axis"]), arrays[0].ndim))]


def _axes(inputs: Inputs, attrs: dict[str, Any]) -> list[int] | None:
    """Axes given as input 1 (newer opsets) or as the attribute (older ones)."""
    given = _optional(inputs, 1)
    return int_list(given) if given is not None else attrs.get("axes")


@register("Squeeze")
def squeeze(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, axes = inputs[0], _axes(inputs, attrs)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(normalize_axes(axes, x.ndim)))]


@register("Unsqueeze")
def unsqueeze(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, axes = inputs[0], _axes(inputs, attrs)
    return [np.expand_dims(x, tuple(normalize_axes(axes, x.ndim + len(axes))))]


@register("Shape")
def shape(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    dims = inputs[0].shape
    start, end = attrs.get("start", 0), attrs.get("end")
    return [np.array(dims[start:end], dtype=np.int64)]


@register("Size")
def size(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    return [np.array(inputs[0].size, dtype=np.int64)]


@register("Gather")
def gather(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    data, indices = inputs[0], inputs[1]
    axis = normalize_axis(int(attrs.get("axis", 0)), data.ndim)
    dim = data.shape[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise IndexError(f"Gather indices out of range [-{dim}, {dim - 1}] on axis {axis}")
    if indices.ndim == 0:  # one index: a view, no copy (q, k, v = qkv[0], qkv[1], qkv[2])
        return [data[(slice(None),) * axis + (int(indices) % dim,)]]
    return [np.take(data, np.where(indices < 0, indices + dim, indices), axis=axis)]


@register("Slice")
def slice_(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    data = inputs[0]
    starts, ends = int_list(inputs[1]), int_list(inputs[2])
    axes = int_list(_optional(inputs, 3)) or list(range(len(starts)))
    steps = int_list(_optional(inputs, 4)) or [1] * len(starts)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, normalize_axes(axes, data.ndim), steps, strict=True):
        index[axis] = _clamped_slice(start, end, step, data.shape[axis])
    return [data[tuple(index)]]


def _clamped_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice bounds: negatives count from the end, then clamp; a negative step may end before 0."""
    if step == 0:
        raise ValueError("Slice step cannot be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@prepare("Split")
def prepare_split(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> dict[str, Any]:
    if "split" not in attrs and "num_outputs" not in attrs and n_inputs < 2:
        return {**attrs, "num_outputs": n_outputs}
    return attrs


@register("Split")
def split(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    axis = normalize_axis(int(attrs.get("axis", 0)), x.ndim)
    sizes = int_list(_optional(inputs, 1)) or attrs.get("split")
    if not sizes:
        parts = int(attrs["num_outputs"])
        chunk = -(-x.shape[axis] // parts)
        sizes = [min(chunk, max(x.shape[axis] - i * chunk, 0)) for i in range(parts)]
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {sizes} do not add up to dimension {x.shape[axis]}")
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@register("Expand")
def expand(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, dims = inputs[0], int_list(inputs[1])
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(dims)))]


@register("Tile")
def tile(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    return [np.tile(inputs[0], int_list(inputs[1]))]


@register("ConstantOfShape")
def constant_of_shape(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    value = tensor_attr(attrs["value"]) if "value" in attrs else np.zeros(1, dtype=np.float32)
    return [np.full(int_list(inputs[0]), value.reshape(-1)[0], dtype=value.dtype)]


@register("Range")
def range_(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    start, limit, delta = inputs
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


@check("Pad")
def check_pad(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    if attrs.get("mode", "constant") not in ("constant", "reflect", "edge", "wrap"):
        return f"Pad mode {attrs['mode']!r} is not implemented"
    return None


@register("Pad")
def pad(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    """Pads may be negative (crop).  Inputs: data, pads, constant_value, axes (opset >= 11)."""
    x, pads = inputs[0], int_list(inputs[1])
    value = _optional(inputs, 2)
    axes = normalize_axes(int_list(_optional(inputs, 3)) or list(range(x.ndim)), x.ndim)
    n = len(axes)
    widths = [(0, 0)] * x.ndim
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[n + i])
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(widths))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        fill = value.reshape(-1)[0] if value is not None and value.size else 0
        return [np.pad(x, grow, mode="constant", constant_values=fill)]
    return [np.pad(x, grow, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]
