"""Scaled dot-product attention as exporters emit it to one FusedAttention node."""

from __future__ import annotations

from typing import Any

from converter.passes.common import _only_reader, _producers, _readers, _scalar, _without
from converter.translate import FerryGraph


def fuse_attention(graph: FerryGraph) -> FerryGraph:
    """Scaled dot-product attention as exporters emit it -> one FusedAttention node:
    MatMul(q, Transpose(k) | kT) -> Mul/Div by a constant -> [Add mask] -> Softmax(-1) -> MatMul(., v)."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "Softmax" or index in drop:
            continue
        match = _match_attention(graph, readers, producers, index)
        if match is None:
            continue
        inputs, attrs, members, last = match
        drop.update(i for i in members if i != last)
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "FusedAttention",
            "inputs": inputs,
            "outputs": graph.nodes[last]["outputs"],
            "attrs": attrs,
        }
    return _without(graph, drop, changed)


def _match_attention(graph, readers, producers, softmax_index):
    softmax = graph.nodes[softmax_index]
    if int(softmax["attrs"].get("axis", -1)) != -1 or graph.opset < 13:
        return None
    members, mask = [softmax_index], None
    current = producers.get(softmax["inputs"][0])
    if current is not None and graph.nodes[current]["op"] == "Add":  # an additive mask
        add = graph.nodes[current]
        before = producers.get(add["inputs"][0])
        if before is None or _only_reader(graph, readers, add["outputs"][0]) != softmax_index:
            return None
        members.append(current)
        mask, current = add["inputs"][1], before
    if current is None or graph.nodes[current]["op"] not in ("Mul", "Div"):
        return None
    scaling = graph.nodes[current]
    factor = _scalar(graph, scaling["inputs"][1])
    if factor is None or factor == 0 or _only_reader(graph, readers, scaling["outputs"][0]) != members[-1]:
        return None
    scale = factor if scaling["op"] == "Mul" else 1.0 / factor
    members.append(current)
    scores_index = producers.get(scaling["inputs"][0])
    if scores_index is None or graph.nodes[scores_index]["op"] != "MatMul":
        return None
    if _only_reader(graph, readers, graph.nodes[scores_index]["outputs"][0]) != current:
        return None
    members.append(scores_index)
    q, k = graph.nodes[scores_index]["inputs"]
    attrs: dict[str, Any] = {"scale": scale, "k_transposed": 1}
    transpose_index = producers.get(k)
    if transpose_index is not None and _only_reader(graph, readers, k) == scores_index:
        transpose = graph.nodes[transpose_index]
        perm = transpose["attrs"].get("perm") or []
        swap_last_two = [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]
        if transpose["op"] == "Transpose" and len(perm) >= 2 and perm == swap_last_two:
            k, attrs["k_transposed"] = transpose["inputs"][0], 0
            members.append(transpose_index)
    out_index = _only_reader(graph, readers, softmax["outputs"][0])
    if out_index is None or graph.nodes[out_index]["op"] != "MatMul":
        return None
    output = graph.nodes[out_index]
    if output["inputs"][0] != softmax["outputs"][0]:
        return None
    members.append(out_index)
    inputs = [q, k, output["inputs"][1]] + ([mask] if mask else [])
    return inputs, attrs, members, out_index


run = fuse_attention
