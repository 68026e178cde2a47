"""GroupNormalization (opset 21: scale and bias per channel), the normalisation of every UNet and
VAE block.  Opset 18's per-group form is deprecated and the ONNX checker refuses it, so it never
reaches the engine.  Statistics are float32 over each group's channels and spatial positions
(the spec's stash_type 1).  Exporters that predate the op write it as Reshape ->
InstanceNormalization -> Reshape -> Mul -> Add, which the engine already runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.normalization import DEFAULT_EPSILON
from engine.ops.registry import check, register


@check("GroupNormalization")
def check_group_norm(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    groups = attrs.get("num_groups")
    if not isinstance(groups, int) or groups < 1:
        return f"GroupNormalization needs a positive num_groups, got {groups!r}"
    if attrs.get("stash_type", 1) != 1:
        return "GroupNormalization with stash_type other than 1 (float32) is not implemented"
    return None


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


@register("GroupNormalization")
def group_normalization(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale, bias = inputs[:3]
    y = _normalized(x, int(attrs["num_groups"]), attrs.get("epsilon", DEFAULT_EPSILON))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y *= scale.astype(np.float32).reshape(shape)
    y += bias.astype(np.float32).reshape(shape)
    return [y.astype(x.dtype, copy=False)]
