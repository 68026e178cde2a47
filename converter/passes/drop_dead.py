"""Dead-node and unread-tensor removal."""

from __future__ import annotations

from converter.passes.common import _graph_outputs, _replace
from converter.translate import FerryGraph


def drop_dead(graph: FerryGraph) -> FerryGraph:
    """Remove nodes nothing downstream of the outputs needs, and tensors no node reads."""
    needed = _graph_outputs(graph)
    kept = []
    for node in reversed(graph.nodes):
        if any(name in needed for name in node["outputs"]):
            kept.append(node)
            needed.update(name for name in node["inputs"] if name)
    kept.reverse()
    tensors = {name: array for name, array in graph.tensors.items() if name in needed}
    return _replace(graph, nodes=kept, tensors=tensors)


run = drop_dead
