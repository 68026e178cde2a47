"""GroupNormalization (opset 21: scale and bias per channel), the normalisation of every UNet and
VAE block, and FusedGroupNorm: the same followed by SiLU (``y * sigmoid(y)``), which every ResNet
block applies next (the converter's fuse_group_norm_silu writes it).  Opset 18's per-group form
is deprecated and the ONNX checker refuses it, so it never reaches the engine.  Statistics are
float32 over each group's channels and spatial positions (the spec's stash_type 1).  Exporters
that predate the op write it as Reshape -> InstanceNormalization -> Reshape -> Mul -> Add, which
the engine already runs.  The JIT twin (group_norm_jit.py) does a group at a time in cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.normalization import DEFAULT_EPSILON
from engine.ops.registry import check, register

ACTIVATIONS = (None, "Silu")
INTERNAL_OPS = frozenset({"FusedGroupNorm"})  # only the converter writes it


@check("GroupNormalization")
def check_group_norm(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    groups = attrs.get("num_groups")
    if not isinstance(groups, int) or groups < 1:
        return f"GroupNormalization needs a positive num_groups, got {groups!r}"
    if attrs.get("stash_type", 1) != 1:
        return "GroupNormalization with stash_type other than 1 (float32) is not implemented"
    return None


@check("FusedGroupNorm")
def check_fused_group_norm(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    if attrs.get("activation") not in ACTIVATIONS:
        return f"FusedGroupNorm activation {attrs.get('activation')!r} is not one of {ACTIVATIONS[1:]}"
    return check_group_norm(attrs, n_inputs, n_outputs)


def _normalized(x: np.ndarray, groups: int, epsilon: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) per (sample, group), as a new float32 array of x's shape."""
    n, c = x.shape[0], x.shape[1]
    if c % groups:
        raise ValueError(f"GroupNormalization: {c} channels do not split into {groups} groups")
    grouped = x.astype(np.float32).reshape(n, groups, -1)
    mean = grouped.mean(axis=2, keepdims=True, dtype=np.float32)
    y = grouped - mean  # the one full-size temporary; the rest works in place on it
    var = np.einsum("ngk,ngk->ng", y, y)[..., None] / np.float32(y.shape[2])
    y *= 1.0 / np.sqrt(var + np.float32(epsilon))
    return y.reshape(x.shape)


def silu_into(y: np.ndarray) -> np.ndarray:
    """y = y * sigmoid(y) = y / (1 + exp(-y)), in place on float32 y (one temporary)."""
    gate = np.negative(y)
    with np.errstate(over="ignore"):  # exp(-y) overflowing to inf gives the right limit, -0
        np.exp(gate, out=gate)
    gate += np.float32(1)
    y /= gate
    return y


@register("GroupNormalization")
def group_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale, bias = inputs[:3]
    y = _normalized(x, int(attrs["num_groups"]), attrs.get("epsilon", DEFAULT_EPSILON))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y *= scale.astype(np.float32).reshape(shape)
    y += bias.astype(np.float32).reshape(shape)
    return [y.astype(x.dtype, copy=False)]


@register("FusedGroupNorm")
def fused_group_norm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """GroupNormalization, then the activation (SiLU) on its float32 result."""
    x = inputs[0]
    y = group_normalization([x.astype(np.float32, copy=False), *inputs[1:3]], attrs)[0]
    if attrs.get("activation") == "Silu":
        silu_into(y)
    return [y.astype(x.dtype, copy=False)]
