"""An activation after Conv, Gemm or MatMul fused into it."""

from __future__ import annotations

from typing import Any

from converter.passes.common import _only_reader, _readers, _scalar, _without
from converter.translate import FerryGraph

FUSABLE_ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSwish", "Gelu", "LeakyRelu", "Tanh", "HardSigmoid")


FUSE_INTO = {"Conv": "FusedConv", "Gemm": "FusedGemm", "MatMul": "FusedMatMul", "FusedMatMul": "FusedMatMul"}


def fuse_activation(graph: FerryGraph) -> FerryGraph:
    """Conv / Gemm / MatMul followed by Relu, Clip (constant bounds), Sigmoid, HardSwish, Gelu...
    -> one Fused* node applying the activation to its own output."""
    readers = _readers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] not in FUSE_INTO or "activation" in node["attrs"]:
            continue
        act_index = _only_reader(graph, readers, node["outputs"][0])
        if act_index is None or graph.nodes[act_index]["op"] not in FUSABLE_ACTIVATIONS:
            continue
        act = graph.nodes[act_index]
        extra = _activation_attrs(graph, act)
        if extra is None:
            continue
        attrs = {**node["attrs"], "activation": act["op"], "activation_attrs": extra}
        changed[index] = {**node, "op": FUSE_INTO[node["op"]], "attrs": attrs, "outputs": act["outputs"]}
        drop.add(act_index)
    return _without(graph, drop, changed)


def _activation_attrs(graph: FerryGraph, act: dict[str, Any]) -> dict[str, Any] | None:
    if act["op"] != "Clip":
        return dict(act["attrs"])
    bounds = {}
    for key, position in (("min", 1), ("max", 2)):
        name = act["inputs"][position] if len(act["inputs"]) > position else ""
        if name:
            value = _scalar(graph, name)
            if value is None:
                return None  # bounds computed at run time
            bounds[key] = value
        elif key in act["attrs"]:
            bounds[key] = act["attrs"][key]
    return bounds


run = fuse_activation
