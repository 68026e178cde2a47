"""Fused ops the converter emits: Conv / Gemm / MatMul (+ bias) followed by an activation, and
scaled dot-product attention.

The attrs are the base op's, plus ``activation`` (Relu, Clip, Sigmoid, HardSwish, Gelu,
LeakyRelu...) and ``activation_attrs`` (that op's attributes; Clip's bounds as ``min``/``max``).
The activation is applied in place on the base op's freshly computed output, which saves a
pass over memory and an intermediate array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.ops.registry import CHECKS, REGISTRY, SELECTORS, Kernel, check, register, selector

INTERNAL_OPS = frozenset({"FusedConv", "FusedGemm", "FusedMatMul", "FusedAttention"})
ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSwish", "Gelu", "LeakyRelu", "Tanh", "HardSigmoid")


def apply_activation(y: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The node's activation applied to ``y`` (a fresh array this node owns)."""
    name = attrs.get("activation")
    if name is None:
        return y
    extra = attrs.get("activation_attrs") or {}
    if name == "Relu":
        return np.maximum(y, y.dtype.type(0), out=y)
    if name == "Clip":
        low, high = extra.get("min"), extra.get("max")
        if low is not None:
            np.maximum(y, y.dtype.type(low), out=y)
        if high is not None:
            np.minimum(y, y.dtype.type(high), out=y)
        return y
    return REGISTRY[name]([y], extra)[0]


def _check_fused(base: str) -> Any:
    def check_node(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
        name = attrs.get("activation")
        if name is not None and name not in ACTIVATIONS:
            return f"fused activation {name!r} is not one of {ACTIVATIONS}"
        if name is not None and name in CHECKS:
            reason = CHECKS[name](attrs.get("activation_attrs") or {}, 1, 1)
            if reason:
                return reason
        return CHECKS[base](attrs, n_inputs, n_outputs) if base in CHECKS else None

    return check_node


for _base in ("Conv", "Gemm", "MatMul"):
    check(f"Fused{_base}")(_check_fused(_base))


@register("FusedConv")
def fused_conv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [apply_activation(REGISTRY["Conv"](inputs, attrs)[0], attrs)]


@selector("FusedConv")
def select_fused_conv(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> Kernel:
    """The Conv variant the engine would pick for these shapes, with the activation after it."""
    inner = SELECTORS["Conv"](attrs, shapes) if "Conv" in SELECTORS else REGISTRY["Conv"]

    def fused_conv_variant(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [apply_activation(inner(inputs, attrs)[0], attrs)]

    fused_conv_variant.__name__ = f"fused_{getattr(inner, '__name__', 'conv')}"
    return fused_conv_variant


@register("FusedGemm")
def fused_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [apply_activation(REGISTRY["Gemm"](inputs, attrs)[0], attrs)]


@register("FusedMatMul")
def fused_matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A @ B, plus a bias (input 2, broadcast over the last axis) when given, then the activation."""
    y = np.matmul(inputs[0], inputs[1])
    if len(inputs) > 2 and inputs[2] is not None:
        y += inputs[2]
    return [apply_activation(y, attrs)]


@register("FusedAttention")
def fused_attention(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """softmax(q @ k^T * scale [+ mask]) @ v over the last axis.

    Inputs q [..., S, D], k ([..., T, D], or [..., D, T] when ``k_transposed``), v [..., T, Dv],
    optional additive mask broadcastable to [..., S, T].  The scores are normalised in place.
    """
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask = inputs[3] if len(inputs) > 3 else None
    keys = k if attrs.get("k_transposed", 0) else np.swapaxes(k, -1, -2)
    scores = np.matmul(q, keys)
    scores *= scores.dtype.type(attrs.get("scale", 1.0))
    if mask is not None:
        if np.broadcast_shapes(scores.shape, mask.shape) == scores.shape:
            scores += mask
        else:
            scores = scores + mask
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return [np.matmul(scores, v)]
