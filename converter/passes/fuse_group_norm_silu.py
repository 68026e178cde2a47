"""GroupNormalization followed by SiLU (``x * Sigmoid(x)``) -> one FusedGroupNorm node.

Every ResNet block of a UNet or VAE normalises and then applies SiLU before its convolution;
torch exports SiLU as Sigmoid and Mul, so each norm becomes three nodes over the same full-size
activation (three passes over memory and two temporaries).  The engine's FusedGroupNorm
(engine/ops/group_norm.py) applies the activation to each group while it is in cache.  A new op
name, not an attribute on GroupNormalization: an engine that does not know it refuses the
package instead of silently skipping the SiLU.
"""

from __future__ import annotations

from typing import Any

from converter.passes.common import _graph_outputs, _only_reader, _other, _readers, _without
from converter.translate import FerryGraph

FUSED_OP = "FusedGroupNorm"


def fuse_group_norm_silu(graph: FerryGraph) -> FerryGraph:
    """Each GroupNormalization whose output only feeds ``Mul(y, Sigmoid(y))`` takes the SiLU."""
    readers, outputs = _readers(graph), _graph_outputs(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "GroupNormalization" or node["outputs"][0] in outputs:
            continue
        match = _silu_after(graph, readers, node["outputs"][0])
        if match is None:
            continue
        sigmoid, mul = match
        drop.update((sigmoid, mul))
        attrs = {**node["attrs"], "activation": "Silu"}
        changed[index] = {**node, "op": FUSED_OP, "attrs": attrs, "outputs": graph.nodes[mul]["outputs"]}
    return _without(graph, drop, changed)


def _silu_after(graph: FerryGraph, readers: dict[str, list[int]], value: str) -> tuple[int, int] | None:
    """(Sigmoid index, Mul index) when exactly those two read ``value`` as ``value * Sigmoid(value)``."""
    found = readers.get(value, [])
    if len(found) != 2:
        return None
    by_op = {graph.nodes[i]["op"]: i for i in found}
    sigmoid, mul = by_op.get("Sigmoid"), by_op.get("Mul")
    if sigmoid is None or mul is None:
        return None
    gate = graph.nodes[sigmoid]["outputs"][0]
    mul_node = graph.nodes[mul]
    if _only_reader(graph, readers, gate) != mul or value not in mul_node["inputs"][:2]:
        return None
    if _other(mul_node, value) != gate or len(mul_node["inputs"]) != 2:
        return None
    return sigmoid, mul


run = fuse_group_norm_silu
