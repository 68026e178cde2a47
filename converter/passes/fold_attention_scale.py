"""Attention's scale folded into the q projection's weights and bias."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converter.passes.common import _graph_outputs, _producers, _readers, _replace, _without
from converter.translate import FerryGraph


def fold_attention_scale(graph: FerryGraph) -> FerryGraph:
    """Fold an unmasked FusedAttention's scale (times log2(e), for the kernel's base-2 softmax)
    into the columns of the q projection's weights and bias, when q, k and v are views of one
    FusedMatMul's output and q's columns are read by nothing else: the kernel then uses q as it
    comes instead of making a scaled copy of it (attr ``q_log2e``)."""
    readers, producers = _readers(graph), _producers(graph)
    tensors = dict(graph.tensors)
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        views = node["attrs"].get("views") if node["op"] == "FusedAttention" else None
        if not views or len(node["inputs"]) != 3 or node["attrs"].get("q_log2e") or None in views:
            continue
        source = node["inputs"][0]
        projection_index = producers.get(source)
        columns = _q_columns(graph, node, readers, projection_index)
        if columns is None or projection_index in changed:
            continue
        projection = graph.nodes[projection_index]
        factor = float(node["attrs"].get("scale", 1.0)) * math.log2(math.e)
        weight_name, bias_name = projection["inputs"][1], projection["inputs"][2]
        weight, bias = tensors[weight_name].astype(np.float64), tensors[bias_name].astype(np.float64)
        weight[:, columns] *= factor
        bias[columns] *= factor
        names = [f"{weight_name}@q_scaled", f"{bias_name}@q_scaled"]
        tensors[names[0]] = weight.astype(tensors[weight_name].dtype)
        tensors[names[1]] = bias.astype(tensors[bias_name].dtype)
        changed[projection_index] = {**projection, "inputs": [projection["inputs"][0], *names]}
        changed[index] = {**node, "attrs": {**node["attrs"], "scale": 1.0, "q_log2e": 1}}
    return _replace(_without(graph, set(), changed), tensors=tensors)


def _q_columns(
    graph: FerryGraph, node: dict[str, Any], readers: dict[str, list[int]], projection_index: int | None
) -> np.ndarray | None:
    """The output columns of the attention's q projection that q reads, when that projection
    is a float FusedMatMul with its own constant weights and bias, read by this node alone (as
    q, k and v), and no column is read both as q and as k or v."""
    source = node["inputs"][0]
    alone = set(node["inputs"]) == {source} and len(set(readers[source])) == 1
    if projection_index is None or not alone or source in _graph_outputs(graph):
        return None
    projection = graph.nodes[projection_index]
    inputs = projection["inputs"]
    if projection["op"] != "FusedMatMul" or len(inputs) != 3 or projection["attrs"].get("activation"):
        return None
    weight, bias = graph.tensors.get(inputs[1]), graph.tensors.get(inputs[2])
    if weight is None or bias is None or weight.ndim != 2 or bias.shape != (weight.shape[1],):
        return None
    if weight.dtype.kind != "f" or any(len(readers.get(name, [])) != 1 for name in inputs[1:]):
        return None
    width = weight.shape[1]
    q, k, v = (set(_view_indices(view).reshape(-1) % width) for view in node["attrs"]["views"])
    if q & (k | v):
        return None
    return np.array(sorted(q), dtype=np.int64)


def _view_indices(view: dict[str, Any]) -> np.ndarray:
    """Every flat index a view {"shape", "offset", "strides"} reads."""
    index = np.full([int(d) for d in view["shape"]], int(view["offset"]), dtype=np.int64)
    for axis, (count, stride) in enumerate(zip(view["shape"], view["strides"], strict=True)):
        along = [-1 if other == axis else 1 for other in range(index.ndim)]
        index += np.arange(int(count), dtype=np.int64).reshape(along) * int(stride)
    return index


run = fold_attention_scale
