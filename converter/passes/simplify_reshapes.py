"""Reshape of a Reshape to one Reshape."""

from __future__ import annotations

from typing import Any

from converter.passes.common import _only_reader, _producers, _readers, _without
from converter.translate import FerryGraph


def simplify_reshapes(graph: FerryGraph) -> FerryGraph:
    """Reshape(Reshape(x, s1), s2) -> Reshape(x, s2) when s2 is constant and has no 0 (copy) dims."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        first_index = producers.get(node["inputs"][0]) if node["op"] == "Reshape" else None
        if first_index is None or first_index in changed or first_index in drop:
            continue
        first = graph.nodes[first_index]
        shape = graph.tensors.get(node["inputs"][1])
        if first["op"] != "Reshape" or shape is None or 0 in shape.reshape(-1).tolist():
            continue
        if _only_reader(graph, readers, first["outputs"][0]) != index:
            continue
        drop.add(first_index)
        changed[index] = {**node, "inputs": [first["inputs"][0], node["inputs"][1]]}
    return _without(graph, drop, changed)


run = simplify_reshapes
