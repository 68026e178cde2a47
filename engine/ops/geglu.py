"""FusedGeglu: GEGLU, ``value * gelu(gate)`` over the two halves of one tensor's last axis, as a
transformer's feed-forward (diffusers' GEGLU) writes it after its projection: torch exports
``chunk(2, -1)`` as two Slices, then Gelu on the second half and Mul.  The converter's
fuse_geglu writes this op; the JIT twin (rows_jit.py) does each row in one call while it is in
L1, where the unfused nodes copied the gate out, ran GELU over it and multiplied in two more
passes.  A new op name, not an attribute: an engine that does not know it refuses the package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.activation import gelu
from engine.ops.registry import check, register

INTERNAL_OPS = frozenset({"FusedGeglu"})  # only the converter writes it


@check("FusedGeglu")
def check_fused_geglu(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    half = attrs.get("half")
    if not isinstance(half, int) or half < 1:
        return f"FusedGeglu needs a positive int half (the gate's offset), got {half!r}"
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"FusedGeglu approximate={attrs['approximate']!r} is not one of 'none', 'tanh'"
    return None


def halves(x: np.ndarray, attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(value, gate): x[..., :half] and x[..., half : 2 * half] (the converter's Slice bounds)."""
    half = int(attrs["half"])
    if x.ndim == 0 or x.shape[-1] < 2 * half:
        raise ValueError(f"FusedGeglu: last axis of {x.shape} is narrower than twice half={half}")
    return x[..., :half], x[..., half : 2 * half]


@register("FusedGeglu")
def fused_geglu(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """x[..., :half] * Gelu(x[..., half : 2 * half]), the Gelu with the graph's ``approximate``."""
    value, gate = halves(inputs[0], attrs)
    y = gelu([gate], {"approximate": attrs.get("approximate", "none")})[0]
    np.multiply(value, y, out=y)
    return [y]
