"""Gemm and MatMul."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.registry import register


@register("Gemm")
def gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm needs 2-D A and B, got A{a.shape} B{b.shape}")
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None and beta != 0.0:
        y += c * c.dtype.type(beta) if beta != 1.0 else c
    return [y]


@register("MatMul")
def matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [np.matmul(inputs[0], inputs[1])]
