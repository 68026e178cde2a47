"""Graph clean-ups that need no numerics: Identity/Dropout removal and dead-node elimination.

Kept deliberately small; each pass preserves the graph's inputs and outputs exactly.
"""

from __future__ import annotations

from converter.translate import FerryGraph

PASS_THROUGH = {"Identity", "Dropout"}


def optimize(graph: FerryGraph) -> FerryGraph:
    graph = _drop_pass_through(graph)
    return _drop_dead(graph)


def _drop_pass_through(graph: FerryGraph) -> FerryGraph:
    """Remove Identity (and inference-time Dropout) nodes whose output is not a graph output."""
    outputs = {spec["name"] for spec in graph.outputs}
    read = {name for node in graph.nodes for name in node["inputs"]}
    alias: dict[str, str] = {}
    nodes = []
    for node in graph.nodes:
        node = {**node, "inputs": [alias.get(name, name) for name in node["inputs"]]}
        if _is_pass_through(node, outputs, read):
            alias[node["outputs"][0]] = node["inputs"][0]
            continue
        nodes.append(node)
    return FerryGraph(**{**graph.__dict__, "nodes": nodes})


def _is_pass_through(node: dict, outputs: set[str], read: set[str]) -> bool:
    if node["op"] not in PASS_THROUGH or node["outputs"][0] in outputs or not node["inputs"][0]:
        return False
    extra = [name for name in node["outputs"][1:] if name]  # Dropout's mask
    return not any(name in read or name in outputs for name in extra)


def _drop_dead(graph: FerryGraph) -> FerryGraph:
    """Remove nodes nothing downstream of the outputs needs, and tensors no node reads."""
    needed = {spec["name"] for spec in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if any(name in needed for name in node["outputs"]):
            kept.append(node)
            needed.update(name for name in node["inputs"] if name)
    kept.reverse()
    tensors = {name: array for name, array in graph.tensors.items() if name in needed}
    return FerryGraph(**{**graph.__dict__, "nodes": kept, "tensors": tensors})
