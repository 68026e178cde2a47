"""DynamicQuantizeLinear: float32 to uint8 with a per-tensor scale and zero point computed from
the values themselves at run time (what onnxruntime's quantize_dynamic and
``ferry-convert --activations dynamic`` put before a quantized MatMul/Conv).

ONNX semantics, as onnx.reference computes them (in float32):

    low, high = min(0, min(x)), max(0, max(x))
    scale = (high - low) / 255, or 1 / 255 when high == low (x all zero: no division by 0)
    zero = rint(clip(-low / scale, 0, 255))
    y = saturate(rint(x / scale) + zero)

so 0.0 is exactly representable (the range always spans it) and padding can use ``zero``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.registry import register


def parameters(low: float, high: float) -> tuple[np.float32, np.uint8]:
    """The scale and zero point for values in [low, high] (``low``/``high`` the raw minimum and
    maximum, widened here to contain 0)."""
    low, high = np.float32(min(low, 0.0)), np.float32(max(high, 0.0))
    scale = np.float32(1.0 if high == low else high - low) / np.float32(255.0)
    zero = np.rint(np.clip(np.float32(0.0) - low / scale, np.float32(0.0), np.float32(255.0)))
    return np.float32(scale), np.uint8(zero)


@register("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: x (float32); outputs: y (uint8, x's shape), y_scale (float32 scalar), y_zero_point
    (uint8 scalar)."""
    x = np.asarray(inputs[0], dtype=np.float32)
    if x.size == 0:
        scale, zero = parameters(0.0, 0.0)
        return [np.zeros(x.shape, np.uint8), np.array(scale), np.array(zero)]
    scale, zero = parameters(float(x.min()), float(x.max()))
    values = np.rint(x / scale)
    values += np.float32(zero)
    y = np.clip(values, 0.0, 255.0, out=values).astype(np.uint8)
    return [y, np.array(scale), np.array(zero)]
