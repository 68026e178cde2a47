"""Reductions, ArgMax/ArgMin and TopK.  Axes come from the attribute (older opsets) or input 1 (newer)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.ops.common import int_list, normalize_axes, normalize_axis
from engine.ops.registry import register

Inputs = list[np.ndarray | None]


def _reduce(fn: Callable[..., np.ndarray], name: str):
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        given = inputs[1] if len(inputs) > 1 else None
        axes = int_list(given) if given is not None else attrs.get("axes")
        keepdims = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        y = fn(x, axis=tuple(normalize_axes(axes, x.ndim)), keepdims=keepdims)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    kernel.__name__ = name
    return kernel


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """np.mean's sum and division without its bookkeeping: a CNN's global pool of a 1280 x 7 x 7
    channels-last map took 30-60 us in np.mean, 10 in the sum (the same bits: np.mean adds with
    np.add.reduce, then divides by the count).  float16 and integers keep np.mean (it sums those
    in float32 / float64)."""
    if x.dtype not in (np.float32, np.float64):
        return np.mean(x, axis=axis, keepdims=keepdims)
    total = np.add.reduce(x, axis=axis, keepdims=keepdims)
    with np.errstate(invalid="ignore", divide="ignore"):  # an empty mean is NaN, as np.mean's
        return np.true_divide(total, math.prod(x.shape[a] for a in axis))


def _sum_square(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x * x, axis=axis, keepdims=keepdims)


def _l2(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sqrt(_sum_square(x, axis, keepdims))


register("ReduceMean")(_reduce(_mean, "reduce_mean"))
register("ReduceSum")(_reduce(np.sum, "reduce_sum"))
register("ReduceMax")(_reduce(np.max, "reduce_max"))
register("ReduceMin")(_reduce(np.min, "reduce_min"))
register("ReduceProd")(_reduce(np.prod, "reduce_prod"))
register("ReduceSumSquare")(_reduce(_sum_square, "reduce_sum_square"))
register("ReduceL2")(_reduce(_l2, "reduce_l2"))


def _arg(fn: Callable[..., np.ndarray], name: str):
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        axis = normalize_axis(int(attrs.get("axis", 0)), x.ndim)
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis=axis)
            y = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            y = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            y = np.expand_dims(y, axis)
        return [y.astype(np.int64)]

    kernel.__name__ = name
    return kernel


register("ArgMax")(_arg(np.argmax, "arg_max"))
register("ArgMin")(_arg(np.argmin, "arg_min"))


@register("TopK")
def top_k(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    """The k largest (or smallest) values along an axis and their int64 indices, sorted, equal
    values in index order (the spec's tie rule) and NaN counted as the largest, as onnx's
    reference does.  k is input 1 (opset 10+) or the ``k`` attribute (opset 1).  A stable sort
    on the axis reversed, then reversed back, orders descending with ties by lowest index."""
    x = inputs[0]
    if x.ndim == 0:
        raise ValueError("TopK needs an input of rank 1 or more, got a scalar")
    k = _k_of(inputs[1] if len(inputs) > 1 else None, attrs)
    axis = normalize_axis(int(attrs.get("axis", -1)), x.ndim)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"TopK k={k} is outside 0..{n}, the size of axis {axis} of input shape {x.shape}")
    rows = np.moveaxis(x, axis, -1)
    if attrs.get("largest", 1):
        order = np.argsort(rows[..., ::-1], axis=-1, kind="stable")[..., ::-1][..., :k]
        order = n - 1 - order
    else:
        order = np.argsort(rows, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(rows, order, axis=-1)
    return [np.moveaxis(values, -1, axis).copy(), np.moveaxis(order, -1, axis).astype(np.int64)]


def _k_of(given: np.ndarray | None, attrs: dict[str, Any]) -> int:
    if given is None:
        if "k" not in attrs:
            raise ValueError("TopK needs k: an input (opset 10+) or the k attribute (opset 1)")
        return int(attrs["k"])
    if given.size != 1 or given.dtype.kind not in "iu":
        raise ValueError(f"TopK's K must be one integer, got {given.dtype} shaped {given.shape}")
    return int(given.reshape(()))
