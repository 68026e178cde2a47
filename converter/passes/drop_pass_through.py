"""Drop Identity and inference-time Dropout nodes."""

from __future__ import annotations

from converter.passes.common import _graph_outputs, _replace
from converter.translate import FerryGraph

PASS_THROUGH = {"Identity", "Dropout"}


def drop_pass_through(graph: FerryGraph) -> FerryGraph:
    """Remove Identity (and inference-time Dropout) nodes whose output is not a graph output."""
    outputs = _graph_outputs(graph)
    read = {name for node in graph.nodes for name in node["inputs"]}
    alias: dict[str, str] = {}
    nodes = []
    for node in graph.nodes:
        node = {**node, "inputs": [alias.get(name, name) for name in node["inputs"]]}
        if _is_pass_through(node, outputs, read):
            alias[node["outputs"][0]] = node["inputs"][0]
            continue
        nodes.append(node)
    return _replace(graph, nodes=nodes)


def _is_pass_through(node: dict, outputs: set[str], read: set[str]) -> bool:
    if node["op"] not in PASS_THROUGH or node["outputs"][0] in outputs or not node["inputs"][0]:
        return False
    extra = [name for name in node["outputs"][1:] if name]  # Dropout's mask
    return not any(name in read or name in outputs for name in extra)


run = drop_pass_through
