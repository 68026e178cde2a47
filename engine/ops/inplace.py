"""Kernels the planner substitutes for a node: in-place forms and fused patterns.

They keep the ordinary calling convention ``fn(inputs, attrs) -> list[np.ndarray]`` (so the
executor, the profile and any other kernel need nothing new), but some write their result
into an input buffer.  The planner only picks those when that input dies at the node and
owns its memory alone (no constant, feed, graph output or live view shares it); see
``engine/planner.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.registry import Kernel

Inputs = list[np.ndarray | None]

# gelu(x) = x * Phi(x) = x / (1 + exp(u)) with u = -logit(Phi(x)), an odd function of x, fitted
# as -x * P(x^2) with P of degree 6 (weighted by how much an error in u moves gelu): |error| <
# 7e-8 in exact arithmetic, ~6e-7 (a few float32 ulps) evaluated in float32.  17 numpy passes
# instead of the 22 an erfc polynomial times exp(-x^2/2) takes, and passes are what costs here.
_LOGIT_PHI = (
    1.5957684324660537,
    0.07266856622987218,
    -6.625937543511903e-05,
    -0.00011048050066814808,
    7.938243948267043e-06,
    -2.6689435636969214e-07,
    3.611267059697654e-09,
)
_EXP2_COEFFS = tuple(-c * math.log2(math.e) for c in _LOGIT_PHI)  # exp(-u) = exp2(-u * log2(e))


def gelu_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU of a float array into ``out`` (which may be ``x``), in x's precision.

    The top coefficient is positive, so beyond the fitted range u keeps the right sign and
    grows: exp overflows to inf for very negative x (x / inf = -0, the right limit) and
    tends to 0 for large positive x (gelu = x).  Infinities and NaN give what
    0.5 * x * (1 + erf(x / sqrt2)) gives.  Narrower floats are computed in float32: in float16
    the top coefficients underflow and the polynomial changes sign (gelu(6) would be 0).
    """
    if x.dtype.itemsize < 4:
        np.copyto(out, gelu_into(x.astype(np.float32), np.empty(x.shape, np.float32)), casting="unsafe")
        return out
    t = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):  # the limits above; -inf / inf is NaN
        s = np.square(x)
        p = np.multiply(s, t(_EXP2_COEFFS[6]))
        p += t(_EXP2_COEFFS[5])
        for c in reversed(_EXP2_COEFFS[:5]):
            p *= s
            p += t(c)
        p *= x
        np.exp2(p, out=p)  # half the time of np.exp; the log2(e) factor is in the coefficients
        p += t(1)
        return np.divide(x, p, out=out)


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
