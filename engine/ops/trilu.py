"""Trilu: the upper (or lower) triangle of the last two axes, the rest zero.  torch's exporter
writes it for a causal attention mask (CLIP's text encoder, through scaled_dot_product_attention)."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.registry import register


@register("Trilu")
def trilu(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    k = int(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0
    keep = np.triu if attrs.get("upper", 1) else np.tril
    return [keep(x, k)]
