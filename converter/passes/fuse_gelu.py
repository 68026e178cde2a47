"""The erf form of GELU, as PyTorch exports it, to one Gelu node."""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _only_reader, _other, _producers, _readers, _scalar, _without
from converter.translate import FerryGraph


def fuse_gelu(graph: FerryGraph) -> FerryGraph:
    """x * 0.5 * (1 + erf(x / sqrt 2)) as PyTorch exports it (Div, Erf, Add, Mul, Mul) -> Gelu."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "Erf" or index in drop:
            continue
        match = _match_gelu(graph, readers, producers, index)
        if match is None:
            continue
        x, nodes, last = match
        drop.update(i for i in nodes if i != last)
        out = graph.nodes[last]["outputs"]
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "Gelu",
            "inputs": [x],
            "outputs": out,
            "attrs": {},
        }
    return _without(graph, drop, changed)


def _match_gelu(graph, readers, producers, erf_index):
    """(x, node indices, index of the last node) when the Erf sits in a GELU pattern."""
    erf = graph.nodes[erf_index]
    div_index = producers.get(erf["inputs"][0])
    if div_index is None:
        return None
    div = graph.nodes[div_index]
    x = div["inputs"][0]
    if div["op"] == "Div":
        ok = abs((_scalar(graph, div["inputs"][1]) or 0) - np.sqrt(2)) < 1e-3
    elif div["op"] == "Mul":
        ok = abs((_scalar(graph, div["inputs"][1]) or 0) - 1 / np.sqrt(2)) < 1e-3
    else:
        ok = False
    add_index = _only_reader(graph, readers, erf["outputs"][0])
    if not ok or add_index is None or _only_reader(graph, readers, div["outputs"][0]) != erf_index:
        return None
    add = graph.nodes[add_index]
    if add["op"] != "Add" or _scalar(graph, _other(add, erf["outputs"][0])) != 1.0:
        return None
    # then Mul by x and Mul by 0.5, in either order: (x * (1 + erf)) * 0.5 or x * ((1 + erf) * 0.5)
    first_index = _only_reader(graph, readers, add["outputs"][0])
    if first_index is None:
        return None
    first = graph.nodes[first_index]
    second_index = _only_reader(graph, readers, first["outputs"][0])
    if first["op"] != "Mul" or second_index is None or graph.nodes[second_index]["op"] != "Mul":
        return None
    second = graph.nodes[second_index]
    factors = {_other(first, add["outputs"][0]), _other(second, first["outputs"][0])}
    half = [f for f in factors if _scalar(graph, f) == 0.5]
    if len(half) != 1 or factors - set(half) != {x}:
        return None
    return x, [div_index, erf_index, add_index, first_index, second_index], second_index


run = fuse_gelu
