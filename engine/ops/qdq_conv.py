"""QdqConv: a Conv whose input arrives quantized (the planner's fusion of QuantizeLinear ->
DequantizeLinear -> Conv/FusedConv with an int8 filter, engine/fuse_qdq.py), and the operands its
integer kernel (int8_conv_jit.py) takes.  The numpy kernel is the unfused form itself.

inputs: q (uint8 [1, C, H, W]), a_scale, a_zero, the filter's int8 values [O, C, kh, kw] and
float32 scales [O] (per output channel), bias [O] or none, a residual or none; attrs: the
Conv's or FusedConv's (activation included).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.qdq_matmul import scalar_of
from engine.ops.quantized import dequantize
from engine.ops.registry import REGISTRY, register

INTERNAL_OPS = frozenset({"QdqConv"})  # made by the planner, never stored in a package
# Narrower convs stay float: the integer GEMM's tiles are 64 output channels wide and read 4
# bytes of a patch per step, so MobileNetV2's 16-32-channel projections and its first conv
# (K = 27) wasted most of each tile (its int8 run was 2.2x its float32 time with them fused).
MIN_WIDTH = 64


def qdq_conv_operands(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> bool:
    """Whether the integer kernel takes these: 2-D images, no groups, uint8 activations per
    tensor, an int8 filter with float32 scales per output channel."""
    q, a_scale, a_zero, w, w_scale = (list(inputs) + [None] * 5)[:5]
    bias = inputs[5] if len(inputs) > 5 else None
    if q is None or w is None or w_scale is None or q.dtype != np.uint8 or w.dtype != np.int8:
        return False
    if q.ndim != 4 or w.ndim != 4 or q.shape[1] != w.shape[1]:
        return False
    out = w.shape[0]
    return (
        int(attrs.get("group", 1)) == 1
        and out >= MIN_WIDTH
        and w[0].size >= MIN_WIDTH
        and scalar_of(a_scale, np.float32)
        and scalar_of(a_zero, np.uint8)
        and w_scale.dtype == np.float32
        and w_scale.size == out
        and (bias is None or (bias.dtype == np.float32 and bias.shape == (out,)))
    )


@register("QdqConv")
def qdq_conv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    q, a_scale, a_zero, w, w_scale = inputs[:5]
    rest = list(inputs[5:])
    x = dequantize(q, a_scale, a_zero, {})
    weights = dequantize(w, w_scale, None, {"axis": 0})
    op = "FusedConv" if len(rest) > 1 or attrs.get("activation") else "Conv"
    return REGISTRY[op]([x, weights, *rest], attrs)
