"""Inference-time normalisations: BatchNormalization, LayerNormalization, InstanceNormalization."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.registry import check, register


@check("BatchNormalization")
def check_batch_norm(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    if attrs.get("training_mode", 0) or n_outputs > 1:
        return "BatchNormalization in training mode (running mean/var outputs) is not implemented"
    return None


@register("BatchNormalization")
def batch_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale, bias, mean, var = inputs[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    t = x.dtype.type
    factor = (scale / np.sqrt(var + t(attrs.get("epsilon", 1e-5)))).astype(x.dtype)
    shift = (bias - mean * factor).astype(x.dtype)
    return [x * factor.reshape(shape) + shift.reshape(shape)]


@register("InstanceNormalization")
def instance_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale, bias = inputs[:3]
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + x.dtype.type(attrs.get("epsilon", 1e-5)))
    return [y * scale.reshape(shape) + bias.reshape(shape)]


@register("LayerNormalization")
def layer_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Normalises over axes [axis, rank); also returns Mean and InvStdDev (shape kept, dims 1)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = normalize_axis(int(attrs.get("axis", -1)), x.ndim)
    axes = tuple(range(axis, x.ndim))
    wide = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    mean = wide.mean(axis=axes, keepdims=True)
    y = wide - mean  # the one full-size temporary: everything after works in place on it
    var = np.square(y).mean(axis=axes, keepdims=True)
    var += wide.dtype.type(attrs.get("epsilon", 1e-5))
    inv_std = np.reciprocal(np.sqrt(var, out=var), out=var)
    y *= inv_std
    if y.dtype == x.dtype:
        y *= scale
        if bias is not None:
            y += bias
        return [y, mean, inv_std]
    y = y.astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype, copy=False), mean, inv_std]
