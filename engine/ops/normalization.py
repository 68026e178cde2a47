"""Inference-time normalisations: BatchNormalization, LayerNormalization, InstanceNormalization."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.registry import check, prepare, register

# ONNX float attributes are float32, so the spec's default epsilon 1e-5 is this value (what
# onnxruntime and the reference use); the double 1e-5 differs in float64 models' results.
DEFAULT_EPSILON = float(np.float32(1e-5))


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
    factor = (scale / np.sqrt(var + t(attrs.get("epsilon", DEFAULT_EPSILON)))).astype(x.dtype)
    shift = (bias - mean * factor).astype(x.dtype)
    return [x * factor.reshape(shape) + shift.reshape(shape)]


@register("InstanceNormalization")
def instance_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale, bias = inputs[:3]
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + x.dtype.type(attrs.get("epsilon", DEFAULT_EPSILON)))
    return [y * scale.reshape(shape) + bias.reshape(shape)]


@prepare("LayerNormalization")
def prepare_layer_norm(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> dict[str, Any]:
    """Note whether the node uses Mean / InvStdDev: a one-row LayerNorm (a decode step) spends a
    third of its time making those two arrays."""
    return {**attrs, "stats": int(n_outputs > 1)}


@register("LayerNormalization")
def layer_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Normalises over axes [axis, rank); also returns Mean and InvStdDev (shape kept, dims 1)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = normalize_axis(int(attrs.get("axis", -1)), x.ndim)
    if _last_axis_fast(x, scale, bias, axis):
        epsilon = attrs.get("epsilon", DEFAULT_EPSILON)
        if x.size == x.shape[-1]:
            return _layer_norm_row(x, scale, bias, float(epsilon), bool(attrs.get("stats", 1)))
        return _layer_norm_rows(x, scale, bias, x.dtype.type(epsilon))
    axes = tuple(range(axis, x.ndim))
    wide = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    mean = wide.mean(axis=axes, keepdims=True)
    y = wide - mean  # the one full-size temporary: everything after works in place on it
    var = np.square(y).mean(axis=axes, keepdims=True)
    var += wide.dtype.type(attrs.get("epsilon", DEFAULT_EPSILON))
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


def _last_axis_fast(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axis: int) -> bool:
    n = x.shape[-1] if x.ndim else 0
    return (
        axis == x.ndim - 1
        and n > 0
        and x.dtype in (np.float32, np.float64)
        and scale.shape == (n,)
        and scale.dtype == x.dtype
        and (bias is None or (bias.shape == (n,) and bias.dtype == x.dtype))
    )


@lru_cache(maxsize=64)
def ones_vector(n: int, dtype: np.dtype) -> np.ndarray:
    """A shared read-only vector of n ones (row sums as dots; making one costs ~1 us)."""
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


def _layer_norm_row(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, epsilon: float, stats: bool
) -> list[np.ndarray]:
    """LayerNorm of a single row (a decode step) in the fewest numpy calls, on 1-D views: at
    this size each call's overhead, not the pass, is the cost.  The sums are BLAS dots and the
    variance's last steps plain float arithmetic (in double, so no less exact)."""
    n = x.shape[-1]
    row = x.reshape(n)
    mean = np.dot(row, ones_vector(n, x.dtype)) / x.dtype.type(n)  # as _layer_norm_rows does
    y = row - mean
    inv_std = 1.0 / math.sqrt(float(np.dot(y, y)) / n + epsilon)
    y *= inv_std
    y *= scale
    if bias is not None:
        y += bias
    if not stats:
        return [y.reshape(x.shape)]
    shape = (*x.shape[:-1], 1)
    return [y.reshape(x.shape), np.full(shape, mean, x.dtype), np.full(shape, inv_std, x.dtype)]


def _layer_norm_rows(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, epsilon: np.floating
) -> list[np.ndarray]:
    """LayerNorm over the last axis in fewer, cheaper passes: row means as a matrix-vector
    product and row sums of squares as an einsum (both ~4x faster than ``mean``), and one
    row-times-column factor (inv_std outer scale) instead of two broadcast multiplies.  A
    uniform scale or bias (packed as a stride-0 vector, see ``pack_layer_norm``) is one
    scalar: an identity one costs no pass at all (a third of the time at ViT-Tiny's sizes)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    mean = np.dot(rows, ones_vector(n, x.dtype))
    mean /= x.dtype.type(n)  # not a dot with 1/n: its rounding would bias large means
    y = rows - mean[:, None]
    var = np.einsum("ij,ij->i", y, y)
    var /= x.dtype.type(n)
    var += epsilon
    inv_std = np.reciprocal(np.sqrt(var, out=var), out=var)
    if not _uniform(scale):
        y *= np.multiply.outer(inv_std, scale)
    elif scale[0] == 1:
        y *= inv_std[:, None]
    else:
        y *= (inv_std * scale[0])[:, None]
    if bias is not None and not (_uniform(bias) and bias[0] == 0):
        y += bias
    stats = (*x.shape[:-1], 1)
    return [y.reshape(x.shape), mean.reshape(stats), inv_std.reshape(stats)]


def _uniform(vector: np.ndarray) -> bool:
    """A stride-0 vector: one value repeated (how ``pack_layer_norm`` marks one)."""
    return vector.ndim == 1 and vector.shape[0] > 0 and vector.strides[0] == 0


def pack_layer_norm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> dict[int, np.ndarray]:
    """Scale and bias that hold one value throughout (identity ones are common: LayerNorm's
    initial weights, and what the converter leaves after folding them into the MatMuls that
    read the LayerNorm, converter.optimize.fold_layer_norm_affine) as stride-0 views of that
    value, so the kernel applies them as a scalar or not at all."""
    packed = {}
    for position in (1, 2):
        vector = inputs[position] if position < len(inputs) else None
        if _repeats_one_value(vector):
            packed[position] = np.broadcast_to(vector[:1], vector.shape)
    return packed


def _repeats_one_value(vector: np.ndarray | None) -> bool:
    if vector is None or vector.ndim != 1 or vector.size == 0 or vector.dtype.kind != "f":
        return False
    return not _uniform(vector) and bool(np.all(vector == vector[0]))


layer_normalization.pack = pack_layer_norm  # type: ignore[attr-defined]
