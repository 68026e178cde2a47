"""MatMul by a constant plus a bias vector to Gemm or FusedMatMul."""

from __future__ import annotations

from typing import Any

from converter.passes.common import _only_reader, _other, _readers, _without
from converter.translate import FerryGraph


def fuse_matmul_add(graph: FerryGraph) -> FerryGraph:
    """MatMul(A, W) + b with constant W and vector b -> Gemm when A is known 2-D, else FusedMatMul."""
    readers = _readers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "MatMul" or node["inputs"][1] not in graph.tensors:
            continue
        weight = graph.tensors[node["inputs"][1]]
        add_index = _only_reader(graph, readers, node["outputs"][0])
        if weight.ndim != 2 or add_index is None or graph.nodes[add_index]["op"] != "Add":
            continue
        add = graph.nodes[add_index]
        bias_name = _other(add, node["outputs"][0])
        bias = graph.tensors.get(bias_name)
        if (
            bias is None
            or bias.ndim != 1
            or bias.shape[0] not in (1, weight.shape[1])
            or bias.dtype != weight.dtype
        ):
            continue
        shape = graph.shapes.get(node["inputs"][0])
        op = "Gemm" if shape is not None and len(shape) == 2 else "FusedMatMul"
        changed[index] = {
            **node,
            "op": op,
            "inputs": [*node["inputs"][:2], bias_name],
            "outputs": add["outputs"],
        }
        drop.add(add_index)
    return _without(graph, drop, changed)


run = fuse_matmul_add
