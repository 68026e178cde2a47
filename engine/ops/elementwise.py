"""Broadcasting arithmetic, comparisons and pointwise math (numpy broadcasting = ONNX multidirectional)."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np

from engine.ops.common import ONNX_DTYPES, onnx_dtype
from engine.ops.registry import check, register

Inputs = list[np.ndarray | None]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        return [np.asarray(fn(a, b)).astype(a.dtype, copy=False)]

    kernel.__name__ = fn.__name__
    return kernel


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero, like C (numpy's // floors)."""
    q = np.floor_divide(a, b)
    return q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))


def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _int_div(a, b) if a.dtype.kind in "iu" else np.divide(a, b)


def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.power(a, b.astype(a.dtype) if a.dtype.kind == "f" else b)


register("Add")(_binary(np.add))
register("Sub")(_binary(np.subtract))
register("Mul")(_binary(np.multiply))
register("Div")(_binary(divide))
register("Pow")(_binary(power))


def _compare(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.asarray(fn(inputs[0], inputs[1]))]

    kernel.__name__ = fn.__name__
    return kernel


register("Equal")(_compare(np.equal))
register("Less")(_compare(np.less))
register("LessOrEqual")(_compare(np.less_equal))
register("Greater")(_compare(np.greater))
register("GreaterOrEqual")(_compare(np.greater_equal))
register("And")(_compare(np.logical_and))
register("Or")(_compare(np.logical_or))
register("Xor")(_compare(np.logical_xor))


def _variadic(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        arrays = [v for v in inputs if v is not None]
        return [np.asarray(reduce(fn, arrays)).astype(arrays[0].dtype, copy=False)]

    kernel.__name__ = fn.__name__
    return kernel


register("Max")(_variadic(np.maximum))
register("Min")(_variadic(np.minimum))
register("Sum")(_variadic(np.add))


@register("Mean")
def mean(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    arrays = [v for v in inputs if v is not None]
    total = reduce(np.add, arrays)
    return [(total / arrays[0].dtype.type(len(arrays))).astype(arrays[0].dtype, copy=False)]


def _unary(fn: Callable[[np.ndarray], np.ndarray]):
    def kernel(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        return [np.asarray(fn(x)).astype(x.dtype, copy=False)]

    kernel.__name__ = fn.__name__
    return kernel


# Numerical Recipes' Chebyshev fit of erfc: t * exp(-z^2 + sum(c_i t^i)), t = 1 / (1 + z/2).
_ERFC_COEFFS = (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
)  # fmt: skip


def erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1.2e-7 relative error, computed in float64 (numpy has no erf; math.erf is per element)."""
    z = np.abs(np.asarray(x, dtype=np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(t)
    for c in reversed(_ERFC_COEFFS):
        poly = poly * t + c
    erfc = t * np.exp(-z * z + poly)
    return np.where(np.asarray(x) >= 0, 1.0 - erfc, erfc - 1.0)


register("Abs")(_unary(np.abs))
register("Neg")(_unary(np.negative))
register("Sqrt")(_unary(np.sqrt))
register("Exp")(_unary(np.exp))
register("Log")(_unary(np.log))
register("Reciprocal")(_unary(np.reciprocal))
register("Floor")(_unary(np.floor))
register("Ceil")(_unary(np.ceil))
register("Round")(_unary(np.round))  # numpy rounds half to even, as ONNX requires
register("Sign")(_unary(np.sign))
register("Sin")(_unary(np.sin))
register("Cos")(_unary(np.cos))
register("Erf")(_unary(erf))


@register("Not")
def logical_not(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    return [np.logical_not(inputs[0])]


@register("Where")
def where(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    condition, a, b = inputs
    return [np.where(condition, a, b).astype(a.dtype, copy=False)]


@register("Cast")
def cast(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    return [inputs[0].astype(onnx_dtype(attrs["to"]))]


@register("CastLike")
def cast_like(inputs: Inputs, attrs: dict[str, Any]) -> list[np.ndarray]:
    return [inputs[0].astype(inputs[1].dtype)]


@check("Cast")
def check_cast(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    if int(attrs.get("to", 0)) not in ONNX_DTYPES:
        return f"Cast to ONNX data type {attrs.get('to')} is not implemented"
    return None
