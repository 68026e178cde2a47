"""QdqMatMul: a QMatMul reading uint8 activations (the planner's fusion of QuantizeLinear ->
DequantizeLinear -> QMatMul, engine/fuse_qdq.py), and the operands its integer kernel takes.

The numpy kernel is the unfused form itself: dequantize, then QMatMul.  The JIT tier's twin
(int8_gemm_jit.py) multiplies the uint8 values and int8 weights in integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.quantized import dequantize, qmatmul
from engine.ops.registry import register

INTERNAL_OPS = frozenset({"QdqMatMul"})  # made by the planner, never stored in a package


def scalar_of(value: np.ndarray | None, dtype: type) -> bool:
    """A one-element array of ``dtype`` (a per-tensor scale or zero point)."""
    return value is not None and value.size == 1 and value.dtype == dtype


def qdq_operands(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> bool:
    """Whether the integer kernel takes these: uint8 activations with a float32 scale and uint8
    zero point per tensor, plain int8 weights [K, N] with float32 scales per column, no weight
    zero point, a float32 bias [N] or none."""
    q, a_scale, a_zero, w, w_scale = (inputs + [None] * 5)[:5]
    zero = inputs[5] if len(inputs) > 5 else None
    bias = inputs[6] if len(inputs) > 6 else None
    if q is None or w is None or w_scale is None or q.dtype != np.uint8 or q.ndim < 1:
        return False
    if w.dtype != np.int8 or w.ndim != 2 or q.shape[-1] != w.shape[0] or w.shape[0] == 0:
        return False
    n = w.shape[1]
    return (
        scalar_of(a_scale, np.float32)
        and scalar_of(a_zero, np.uint8)
        and zero is None
        and w_scale.dtype == np.float32
        and w_scale.size == n
        and (bias is None or (bias.dtype == np.float32 and bias.shape == (n,)))
        and attrs.get("axis", 1) in (1, -1)
        and not attrs.get("block_size")
        and "packed" not in attrs
    )


@register("QdqMatMul")
def qdq_matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: q, a_scale, a_zero (QuantizeLinear's output and parameters), then QMatMul's
    weights, scales, zero point and bias; attrs: QMatMul's."""
    q, a_scale, a_zero = inputs[:3]
    activations = dequantize(q, a_scale, a_zero, {})
    return qmatmul([activations, *inputs[3:]], attrs)
