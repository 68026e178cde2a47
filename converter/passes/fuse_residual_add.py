"""A skip connection's Add (and the activation after it) fused into the Conv before it."""

from __future__ import annotations

from typing import Any

from converter.passes.common import _only_reader, _producers, _readers, _without
from converter.passes.fuse_activation import FUSABLE_ACTIVATIONS, _activation_attrs
from converter.translate import FerryGraph


def fuse_residual_add(graph: FerryGraph) -> FerryGraph:
    """Add(Conv(x), r), then optionally an activation, with r of exactly the conv output's shape
    -> one FusedConv(x, W, B, r): the conv kernel adds r (in its own result's memory layout,
    see engine/ops/conv.py) and applies the activation, so ResNet's and MobileNetV2's skip
    connections need no Add and Relu nodes.  The node takes the conv's place, or the Add's when
    r is made later."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, add in enumerate(graph.nodes):
        match = _residual_conv(graph, readers, producers, index) if add["op"] == "Add" else None
        if match is None:
            continue
        conv_index, residual = match
        conv = graph.nodes[conv_index]
        activation, outputs = _then_activation(graph, readers, add, drop)
        bias = conv["inputs"][2] if len(conv["inputs"]) > 2 else ""
        fused = {
            **conv,
            "op": "FusedConv",
            "attrs": {**conv["attrs"], **activation},
            "inputs": [*conv["inputs"][:2], bias, residual],
            "outputs": outputs,
        }
        ready = producers.get(residual, -1) < conv_index
        changed[conv_index if ready else index] = fused
        drop.add(index if ready else conv_index)
    return _without(graph, drop, changed)


def _residual_conv(
    graph: FerryGraph, readers: dict[str, list[int]], producers: dict[str, int], index: int
) -> tuple[int, str] | None:
    """(index of the Conv, residual value) for the Add at ``index``: one operand made by a plain
    Conv that only this Add reads, the other a computed value of the very same known shape (no
    broadcasting).  With two such Convs, the later one, whose residual is ready where it runs."""
    add = graph.nodes[index]
    if len(add["inputs"]) != 2 or add["inputs"][0] == add["inputs"][1]:
        return None
    options = []
    for value, other in (add["inputs"], add["inputs"][::-1]):
        conv_index = producers.get(value)
        if conv_index is None or other in graph.tensors or _only_reader(graph, readers, value) != index:
            continue
        conv = graph.nodes[conv_index]
        shape = graph.shapes.get(value)
        if conv["op"] != "Conv" or len(conv["inputs"]) > 3 or not shape or len(shape) < 3:
            continue
        if None not in shape and shape == graph.shapes.get(other):
            options.append((conv_index, other))
    return max(options, default=None)


def _then_activation(
    graph: FerryGraph, readers: dict[str, list[int]], add: dict[str, Any], drop: set[int]
) -> tuple[dict[str, Any], list[str]]:
    """The activation attrs and the outputs of a FusedConv standing for ``add``: those of the
    fusable activation that alone reads the Add's output (it joins ``drop``), else none and the
    Add's outputs."""
    act_index = _only_reader(graph, readers, add["outputs"][0])
    act = graph.nodes[act_index] if act_index is not None else None
    if act is None or act["op"] not in FUSABLE_ACTIVATIONS:
        return {}, add["outputs"]
    extra = _activation_attrs(graph, act)
    if extra is None:
        return {}, add["outputs"]
    drop.add(act_index)
    return {"activation": act["op"], "activation_attrs": extra}, act["outputs"]


run = fuse_residual_add
