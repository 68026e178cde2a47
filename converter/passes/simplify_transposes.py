"""Transpose of a Transpose to one Transpose, or to nothing."""

from __future__ import annotations

from typing import Any

from converter.passes.common import _graph_outputs, _only_reader, _producers, _readers, _replace, _without
from converter.translate import FerryGraph


def simplify_transposes(graph: FerryGraph) -> FerryGraph:
    """Transpose(Transpose(x)) -> one Transpose, or nothing when the permutations cancel."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    alias: dict[str, str] = {}
    for index, node in enumerate(graph.nodes):
        first_index = producers.get(node["inputs"][0]) if node["op"] == "Transpose" else None
        if first_index is None or first_index in drop or first_index in changed:
            continue
        first = graph.nodes[first_index]
        if first["op"] != "Transpose" or _only_reader(graph, readers, first["outputs"][0]) != index:
            continue
        outer, inner = node["attrs"].get("perm"), first["attrs"].get("perm")
        if outer is None or inner is None or len(outer) != len(inner):
            continue
        perm = [inner[axis] for axis in outer]
        drop.add(first_index)
        if perm == sorted(perm) and node["outputs"][0] not in _graph_outputs(graph):
            drop.add(index)
            alias[node["outputs"][0]] = first["inputs"][0]
        else:
            changed[index] = {**node, "inputs": [first["inputs"][0]], "attrs": {"perm": perm}}
    out = _without(graph, drop, changed)
    if alias:
        nodes = [{**n, "inputs": [alias.get(v, v) for v in n["inputs"]]} for n in out.nodes]
        out = _replace(out, nodes=nodes)
    return out


run = simplify_transposes
