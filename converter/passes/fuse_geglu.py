"""GEGLU (``value * Gelu(gate)`` over the two halves of one value's last axis) -> FusedGeglu.

diffusers' feed-forward projects to twice its width and splits it with ``chunk(2, dim=-1)``,
which torch exports as two Slices of the projection; Gelu takes the second half, Mul the first.
The engine's FusedGeglu (engine/ops/geglu.py) reads both halves of each row once instead of
copying the gate out and making two more passes.  The halves must be [0, F) and [F, 2F) of the
last axis by constant bounds, so F is known here; the engine reads x[..., :F] and x[..., F:2F]
and refuses a last axis narrower than 2F at run time (the unfused Mul would broadcast or fail).
"""

from __future__ import annotations

from typing import Any

from converter.passes.common import _graph_outputs, _only_reader, _other, _producers, _readers, _without
from converter.translate import FerryGraph

FUSED_OP = "FusedGeglu"


def fuse_geglu(graph: FerryGraph) -> FerryGraph:
    """Each Mul(Slice(x, 0, F), Gelu(Slice(x, F, 2F))) over x's last axis -> FusedGeglu(x)."""
    readers, producers, outputs = _readers(graph), _producers(graph), _graph_outputs(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "Gelu" or node["outputs"][0] in outputs:
            continue
        match = _geglu_around(graph, readers, producers, index)
        if match is None:
            continue
        source, half, nodes, mul = match
        drop.update(i for i in nodes if i != mul)
        attrs = {"half": half, "approximate": node["attrs"].get("approximate", "none")}
        changed[mul] = {
            "name": graph.nodes[mul]["name"],
            "op": FUSED_OP,
            "inputs": [source],
            "outputs": graph.nodes[mul]["outputs"],
            "attrs": attrs,
        }
    return _without(graph, drop, changed)


def _geglu_around(
    graph: FerryGraph, readers: dict[str, list[int]], producers: dict[str, int], gelu: int
) -> tuple[str, int, tuple[int, ...], int] | None:
    """(x, F, the four nodes' indices, the Mul's index) when the Gelu sits in a GEGLU."""
    gelu_node = graph.nodes[gelu]
    gate_slice = producers.get(gelu_node["inputs"][0])
    mul = _only_reader(graph, readers, gelu_node["outputs"][0])
    if gate_slice is None or mul is None or graph.nodes[mul]["op"] != "Mul":
        return None
    mul_node = graph.nodes[mul]
    if len(mul_node["inputs"]) != 2 or gelu_node["outputs"][0] not in mul_node["inputs"]:
        return None
    value_slice = producers.get(_other(mul_node, gelu_node["outputs"][0]))
    if value_slice is None or value_slice == gate_slice:
        return None
    gate, value = _bounds(graph, gate_slice), _bounds(graph, value_slice)
    if gate is None or value is None or gate[0] != value[0]:
        return None
    source, half = gate[0], value[2]
    if value[1:] != (0, half) or gate[1:] != (half, 2 * half) or half < 1:
        return None
    # the slices feed only this GEGLU (the source may have other readers: it stays)
    if _only_reader(graph, readers, graph.nodes[gate_slice]["outputs"][0]) != gelu:
        return None
    if _only_reader(graph, readers, graph.nodes[value_slice]["outputs"][0]) != mul:
        return None
    return source, half, (value_slice, gate_slice, gelu, mul), mul


def _bounds(graph: FerryGraph, index: int) -> tuple[str, int, int] | None:
    """(input, start, end) of a Slice over the last axis with step 1 and constant bounds."""
    node = graph.nodes[index]
    if node["op"] != "Slice" or len(node["inputs"]) < 4:
        return None
    x = node["inputs"][0]
    starts, ends, axes = (_ints(graph, name) for name in node["inputs"][1:4])
    steps = _ints(graph, node["inputs"][4]) if len(node["inputs"]) > 4 and node["inputs"][4] else [1]
    if starts is None or ends is None or axes is None or steps != [1]:
        return None
    if len(starts) != 1 or len(ends) != 1 or len(axes) != 1 or not _last_axis(graph, x, axes[0]):
        return None
    start, end = starts[0], ends[0]
    width = (graph.shapes.get(x) or [None])[-1]
    if isinstance(width, int) and end > width:  # torch's INT64_MAX: to the end of a known width
        end = width
    return x, start, end


def _ints(graph: FerryGraph, name: str) -> list[int] | None:
    array = graph.tensors.get(name)
    if array is None or array.dtype.kind not in "iu" or array.ndim != 1:
        return None
    return [int(v) for v in array]


def _last_axis(graph: FerryGraph, x: str, axis: int) -> bool:
    """-1, or rank - 1 where the inferred shape gives the rank."""
    if axis == -1:
        return True
    shape = graph.shapes.get(x)
    return shape is not None and axis == len(shape) - 1


run = fuse_geglu
