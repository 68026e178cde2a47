"""LayerNorm spelled out in primitive ops, as PyTorch exports it, to one LayerNormalization node."""

from __future__ import annotations

from typing import Any

from converter.passes.common import (
    _graph_outputs,
    _only_reader,
    _other,
    _producers,
    _readers,
    _scalar,
    _without,
)
from converter.translate import FerryGraph


def fuse_layer_norm(graph: FerryGraph) -> FerryGraph:
    """ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul scale, Add bias over the last
    axis (as PyTorch exports LayerNorm) -> LayerNormalization."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "ReduceMean" or index in drop:
            continue
        match = _match_layer_norm(graph, readers, producers, index)
        if match is None:
            continue
        x, scale, bias, eps, members, last = match
        drop.update(i for i in members if i != last)
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "LayerNormalization",
            "inputs": [x, scale, bias],
            "outputs": [graph.nodes[last]["outputs"][0]],
            "attrs": {"axis": -1, "epsilon": eps},
        }
    return _without(graph, drop, changed)


def _last_axis_mean(graph: FerryGraph, node: dict[str, Any]) -> bool:
    axes = node["attrs"].get("axes")
    if axes is None and len(node["inputs"]) > 1 and node["inputs"][1] in graph.tensors:
        axes = graph.tensors[node["inputs"][1]].reshape(-1).tolist()
    return axes == [-1] and int(node["attrs"].get("keepdims", 1)) == 1


def _match_layer_norm(graph, readers, producers, mean_index):
    mean = graph.nodes[mean_index]
    if not _last_axis_mean(graph, mean):
        return None
    x = mean["inputs"][0]
    sub_index = _only_reader(graph, readers, mean["outputs"][0])
    if (
        sub_index is None
        or graph.nodes[sub_index]["op"] != "Sub"
        or graph.nodes[sub_index]["inputs"]
        != [
            x,
            mean["outputs"][0],
        ]
    ):
        return None
    centered = graph.nodes[sub_index]["outputs"][0]
    users = readers.get(centered, [])
    if len(users) != 2 or centered in _graph_outputs(graph):
        return None
    pow_index = next((i for i in users if graph.nodes[i]["op"] == "Pow"), None)
    div_index = next((i for i in users if graph.nodes[i]["op"] == "Div"), None)
    if pow_index is None or div_index is None or _scalar(graph, graph.nodes[pow_index]["inputs"][1]) != 2.0:
        return None
    chain = [pow_index]
    for op in ("ReduceMean", "Add", "Sqrt"):
        following = _only_reader(graph, readers, graph.nodes[chain[-1]]["outputs"][0])
        if following is None or graph.nodes[following]["op"] != op:
            return None
        chain.append(following)
    var_mean, add_eps, sqrt = (graph.nodes[i] for i in chain[1:])
    eps = _scalar(graph, _other(add_eps, var_mean["outputs"][0]))
    div = graph.nodes[div_index]
    if not _last_axis_mean(graph, var_mean) or eps is None or div["inputs"] != [centered, sqrt["outputs"][0]]:
        return None
    mul_index = _only_reader(graph, readers, div["outputs"][0])
    mul = graph.nodes[mul_index] if mul_index is not None else None
    if mul is None or mul["op"] != "Mul" or _other(mul, div["outputs"][0]) not in graph.tensors:
        return None
    add_index = _only_reader(graph, readers, mul["outputs"][0])
    add = graph.nodes[add_index] if add_index is not None else None
    if add is None or add["op"] != "Add" or _other(add, mul["outputs"][0]) not in graph.tensors:
        return None
    scale, bias = _other(mul, div["outputs"][0]), _other(add, mul["outputs"][0])
    if graph.tensors[scale].ndim != 1 or graph.tensors[bias].ndim != 1:
        return None
    members = [mean_index, sub_index, *chain, div_index, mul_index, add_index]
    return x, scale, bias, eps, members, add_index


run = fuse_layer_norm
