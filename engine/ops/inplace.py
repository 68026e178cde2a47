"""Kernels the planner substitutes for a node: in-place forms and fused patterns.

They keep the ordinary calling convention ``fn(inputs, attrs) -> list[np.ndarray]`` (so the
executor, the profile and any other kernel need nothing new), but some write their result
into an input buffer.  The planner only picks those when that input dies at the node and
owns its memory alone (no constant, feed, graph output or live view shares it); see
``engine/planner.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.fastmath import gelu_into
from engine.ops.registry import Kernel

Inputs = list[np.ndarray | None]


def gelu(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [gelu_into(x, np.empty_like(x))]


def gelu_inplace(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [gelu_into(x, x)]


def softmax_inplace(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    axis = normalize_axis(int(attrs.get("axis", -1)), x.ndim)
    x -= x.max(axis=axis, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=axis, keepdims=True)
    return [x]


def clip_into(x: np.ndarray, low: Any, high: Any, out: np.ndarray) -> np.ndarray:
    """max(low, min(x, high)) with None for an open side; NaN stays NaN.

    One np.clip with both bounds (infinite where open) is 3-4x faster than np.maximum /
    np.minimum with a scalar on the numpy builds measured here (those take a slow path).
    """
    if x.dtype.kind != "f":
        if out is not x:
            np.copyto(out, x)
        if low is not None:
            np.maximum(out, np.asarray(low, dtype=x.dtype), out=out)
        if high is not None:
            np.minimum(out, np.asarray(high, dtype=x.dtype), out=out)
        return out
    t = x.dtype.type
    low = t(-np.inf) if low is None else np.asarray(low, dtype=x.dtype)
    high = t(np.inf) if high is None else np.asarray(high, dtype=x.dtype)
    return np.clip(x, low, high, out=out)


def relu_inplace(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [clip_into(x, 0, None, x)]


def clip_inplace(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("max")
    return [clip_into(x, low, high, x)]


def _unary_inplace(fn: Callable[..., np.ndarray], name: str) -> Kernel:
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        return [fn(x, out=x)]

    kernel.__name__ = name
    return kernel


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        np.negative(x, out=out)
        np.exp(out, out=out)
        out += out.dtype.type(1)
        return np.reciprocal(out, out=out)


def _binary_inplace(fn: Callable[..., np.ndarray], target: int, name: str) -> Kernel:
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        return [fn(inputs[0], inputs[1], out=inputs[target])]

    kernel.__name__ = f"{name}_inplace{target}"
    return kernel


UNARY_INPLACE: dict[str, Kernel] = {
    "Relu": relu_inplace,
    "Clip": clip_inplace,
    "Softmax": softmax_inplace,
    "Gelu": gelu_inplace,
    "Sigmoid": _unary_inplace(_sigmoid, "sigmoid_inplace"),
    "Tanh": _unary_inplace(np.tanh, "tanh_inplace"),
    "Exp": _unary_inplace(np.exp, "exp_inplace"),
    "Sqrt": _unary_inplace(np.sqrt, "sqrt_inplace"),
    "Neg": _unary_inplace(np.negative, "neg_inplace"),
    "Abs": _unary_inplace(np.abs, "abs_inplace"),
}

_UFUNCS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
BINARY_INPLACE: dict[tuple[str, int], Kernel] = {
    (op, target): _binary_inplace(fn, target, fn.__name__) for op, fn in _UFUNCS.items() for target in (0, 1)
}
