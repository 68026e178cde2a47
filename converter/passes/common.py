"""Graph helpers the passes share: who reads or produces a value, removing nodes, scalars."""

from __future__ import annotations

from typing import Any

from converter.translate import FerryGraph


def _replace(graph: FerryGraph, **changes: Any) -> FerryGraph:
    return FerryGraph(**{**graph.__dict__, **changes})


def _readers(graph: FerryGraph) -> dict[str, list[int]]:
    """Value name -> indices of the nodes reading it."""
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in node["inputs"]:
            if name:
                readers.setdefault(name, []).append(index)
    return readers


def _producers(graph: FerryGraph) -> dict[str, int]:
    return {name: index for index, node in enumerate(graph.nodes) for name in node["outputs"] if name}


def _graph_outputs(graph: FerryGraph) -> set[str]:
    return {spec["name"] for spec in graph.outputs}


def _only_reader(graph: FerryGraph, readers: dict[str, list[int]], value: str) -> int | None:
    """The single node reading ``value``, if exactly one does and it is not a graph output."""
    found = readers.get(value, [])
    if len(found) != 1 or value in _graph_outputs(graph):
        return None
    return found[0]


def _scalar(graph: FerryGraph, name: str) -> float | None:
    array = graph.tensors.get(name)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def _without(graph: FerryGraph, drop: set[int], changed: dict[int, dict[str, Any]]) -> FerryGraph:
    nodes = [changed.get(i, node) for i, node in enumerate(graph.nodes) if i not in drop]
    return _replace(graph, nodes=nodes)


def _other(node: dict[str, Any], value: str) -> str:
    """The other input of a two-input node, given one of them."""
    a, b = node["inputs"][:2]
    return b if a == value else a
