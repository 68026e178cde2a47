"""torch's GroupNorm export (Reshape, InstanceNormalization, Reshape, Mul, Add) to one node.

torch exports ``nn.GroupNorm`` at opsets before 18 as ``Reshape(x, [0, G, -1])`` ->
``InstanceNormalization`` (scale ones, bias zeros) -> ``Reshape`` back to ``Shape(x)`` ->
``Mul`` by gamma [C, 1, ...] -> ``Add`` beta [C, 1, ...]: five nodes and two full-size
temporaries per norm of a UNet or VAE block.  The engine's GroupNormalization (opset 21's per-
channel scale and bias, engine/ops/group_norm.py) does it in one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _only_reader, _producers, _readers, _replace
from converter.translate import FerryGraph


def fuse_group_norm(graph: FerryGraph) -> FerryGraph:
    """Each match of the pattern -> GroupNormalization(x, gamma, beta, num_groups, epsilon)."""
    readers, producers = _readers(graph), _producers(graph)
    tensors = dict(graph.tensors)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "InstanceNormalization" or index in drop:
            continue
        match = _match(graph, readers, producers, index)
        if match is None:
            continue
        members, last, x, groups, gamma, beta = match
        names = [f"{graph.nodes[last]['name']}@gamma", f"{graph.nodes[last]['name']}@beta"]
        tensors[names[0]], tensors[names[1]] = gamma, beta
        drop.update(i for i in members if i != last)
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "GroupNormalization",
            "inputs": [x, *names],
            "outputs": graph.nodes[last]["outputs"],
            "attrs": {"num_groups": groups, "epsilon": float(node["attrs"].get("epsilon", 1e-5))},
        }
    nodes = [changed.get(i, n) for i, n in enumerate(graph.nodes) if i not in drop]
    return _replace(graph, nodes=nodes, tensors=tensors)


def _match(graph, readers, producers, norm_index):  # noqa: ANN001, ANN202
    """(member indices, the last member, x, groups, gamma [C], beta [C]) or None."""
    norm = graph.nodes[norm_index]
    ones, zeros = (graph.tensors.get(name) for name in norm["inputs"][1:3])
    if ones is None or zeros is None or not (np.all(ones == 1) and np.all(zeros == 0)):
        return None
    split_index = producers.get(norm["inputs"][0])
    if split_index is None or graph.nodes[split_index]["op"] != "Reshape":
        return None
    split = graph.nodes[split_index]
    x, target = split["inputs"][0], graph.tensors.get(split["inputs"][1])
    channels = _channels(graph, x)
    if target is None or channels is None or _only_reader(graph, readers, split["outputs"][0]) != norm_index:
        return None
    groups = int(ones.size)
    if target.tolist() != [0, groups, -1] or channels % groups or int(split["attrs"].get("allowzero", 0)):
        return None
    back_index = _only_reader(graph, readers, norm["outputs"][0])
    if back_index is None or not _reshapes_back(graph, producers, graph.nodes[back_index], x):
        return None
    members, last = [split_index, norm_index, back_index], back_index
    gamma, beta = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    for op, into in (("Mul", gamma), ("Add", beta)):
        step = _affine(graph, readers, graph.nodes[last]["outputs"][0], op, channels, len(graph.shapes[x]))
        if step is None:
            continue
        step_index, values = step
        into[...] = values
        members.append(step_index)
        last = step_index
    return members, last, x, groups, gamma, beta


def _channels(graph, x: str) -> int | None:  # noqa: ANN001
    shape = graph.shapes.get(x)
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int):
        return None
    return int(shape[1])


def _reshapes_back(graph, producers, node: dict[str, Any], x: str) -> bool:  # noqa: ANN001
    """A Reshape to x's own shape: Shape(x) or the constant of x's static shape."""
    if node["op"] != "Reshape":
        return False
    target = node["inputs"][1]
    source = producers.get(target)
    if source is not None:
        shape_node = graph.nodes[source]
        whole = not shape_node["attrs"].get("start") and shape_node["attrs"].get("end") is None
        return shape_node["op"] == "Shape" and shape_node["inputs"][0] == x and whole
    constant, static = graph.tensors.get(target), graph.shapes.get(x)
    return constant is not None and static is not None and constant.tolist() == static


def _affine(graph, readers, value: str, op: str, channels: int, rank: int):  # noqa: ANN001, ANN202
    """(index, per-channel values) of the Mul/Add by a [C, 1, ...] constant that alone reads value."""
    index = _only_reader(graph, readers, value)
    if index is None or graph.nodes[index]["op"] != op:
        return None
    node = graph.nodes[index]
    other = node["inputs"][1] if node["inputs"][0] == value else node["inputs"][0]
    constant = graph.tensors.get(other)
    if constant is None or constant.dtype.kind != "f" or constant.size != channels:
        return None
    if constant.shape != (channels,) + (1,) * (constant.ndim - 1) or constant.ndim > rank - 1:
        return None
    return index, constant.reshape(channels).astype(np.float32)


run = fuse_group_norm
