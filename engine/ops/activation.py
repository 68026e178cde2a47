"""Pointwise activations.  Scalar attributes are cast to the input's dtype so float32 stays float32."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.ops.elementwise import erf
from engine.ops.fastmath import gelu_into
from engine.ops.inplace import clip_into
from engine.ops.registry import check, register


@register("Relu")
def relu(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [clip_into(x, 0, None, np.empty_like(x))]


@register("LeakyRelu")
def leaky_relu(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    alpha = x.dtype.type(attrs.get("alpha", 0.01))
    return [np.where(x >= 0, x, x * alpha)]


@register("Elu")
def elu(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    alpha = x.dtype.type(attrs.get("alpha", 1.0))
    return [np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))]


@register("Sigmoid")
def sigmoid(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [_sigmoid(inputs[0])]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) overflowing to inf gives the right limit, 0
        return (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)


@register("Tanh")
def tanh(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [np.tanh(inputs[0])]


@register("HardSigmoid")
def hard_sigmoid(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    t = x.dtype.type
    alpha, beta = t(attrs.get("alpha", 0.2)), t(attrs.get("beta", 0.5))
    return [np.clip(x * alpha + beta, t(0), t(1))]


@register("HardSwish")
def hard_swish(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    t = x.dtype.type
    return [x * np.clip(x * t(1 / 6) + t(0.5), t(0), t(1))]


@register("Softplus")
def softplus(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [(np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype, copy=False)]


@register("Clip")
def clip(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Bounds come from inputs 2 and 3 (opset >= 11) or from the min/max attributes (older)."""
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("max")
    if low is None and high is None:
        return [x]
    return [clip_into(x, low, high, np.empty_like(x))]


@check("Gelu")
def check_gelu(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"Gelu approximate={attrs['approximate']!r} is not one of 'none', 'tanh'"
    return None


@register("Gelu")
def gelu(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    if attrs.get("approximate", "none") != "tanh" and x.dtype.kind == "f":
        wide = x.astype(np.float32) if x.dtype.itemsize < 4 else x
        return [gelu_into(wide, np.empty_like(wide)).astype(x.dtype, copy=False)]
    wide = x.astype(np.float64)
    if attrs.get("approximate", "none") == "tanh":
        inner = math.sqrt(2 / math.pi) * (wide + 0.044715 * wide**3)
        y = 0.5 * wide * (1 + np.tanh(inner))
    else:
        y = 0.5 * wide * (1 + erf(wide / math.sqrt(2)))
    return [y.astype(x.dtype)]
