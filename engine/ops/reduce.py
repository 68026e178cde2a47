"""Reductions and ArgMax/ArgMin.  Axes come from the attribute (older opsets) or input 1 (newer)."""

from __future__ import annotations

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


def _sum_square(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x * x, axis=axis, keepdims=keepdims)


def _l2(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sqrt(_sum_square(x, axis, keepdims))


register("ReduceMean")(_reduce(np.mean, "reduce_mean"))
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
