"""torch's split attention scale (q * s and kᵀ * s before their product) merged into one scale.

torch's ``scaled_dot_product_attention`` exports as ``MatMul(q * s, kᵀ * s) -> Softmax`` with
``s = sqrt(1 / sqrt(d))`` (numerically kinder in half precision); ``fuse_attention`` matches a
single scale after the product.  Once ``fold_shape_values`` has made each ``s`` a constant,
this pass rewrites the two Muls as ``MatMul(q, kᵀ) * (s_q * s_k)`` so the attention fuses.  An
additive mask between the product and the Softmax (CLIP's causal mask: ``Add(scores, mask)``)
is allowed: fuse_attention takes it as the fused node's mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _only_reader, _producers, _readers, _replace, _scalar
from converter.translate import FerryGraph


def merge_attention_scales(graph: FerryGraph) -> FerryGraph:
    """MatMul(a * s1, b * s2) read only by a last-axis Softmax (directly, or through an additive
    mask) -> MatMul(a, b) * (s1 * s2)."""
    readers, producers = _readers(graph), _producers(graph)
    tensors = dict(graph.tensors)
    drop: set[int] = set()
    rewritten: dict[int, list[dict[str, Any]]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "MatMul" or not _feeds_softmax(graph, readers, node):
            continue
        scaled = [_scaled_operand(graph, readers, producers, name, index) for name in node["inputs"]]
        if any(s is None for s in scaled) or {s[0] for s in scaled} & drop:
            continue
        (mul_a, a, s_a), (mul_b, b, s_b) = scaled
        drop.update((mul_a, mul_b))
        product = f"{node['outputs'][0]}@unscaled"
        scale = f"{node['outputs'][0]}@scale"
        tensors[scale] = np.array([s_a * s_b], dtype=np.float32)
        rewritten[index] = [
            {**node, "inputs": [a, b], "outputs": [product]},
            {
                "name": f"{node['name']}/scale",
                "op": "Mul",
                "inputs": [product, scale],
                "outputs": node["outputs"],
                "attrs": {},
            },
        ]
    nodes = []
    for index, node in enumerate(graph.nodes):
        if index not in drop:
            nodes.extend(rewritten.get(index, [node]))
    return _replace(graph, nodes=nodes, tensors=tensors)


def _feeds_softmax(graph: FerryGraph, readers: dict[str, list[int]], node: dict[str, Any]) -> bool:
    reader = _only_reader(graph, readers, node["outputs"][0])
    if reader is not None and graph.nodes[reader]["op"] == "Add":  # Add(scores, mask), as matched
        add = graph.nodes[reader]
        reader = (
            _only_reader(graph, readers, add["outputs"][0])
            if add["inputs"][0] == node["outputs"][0]
            else None
        )
    if reader is None or graph.nodes[reader]["op"] != "Softmax":
        return False
    return int(graph.nodes[reader]["attrs"].get("axis", -1)) == -1 and graph.opset >= 13


def _scaled_operand(
    graph: FerryGraph, readers: dict[str, list[int]], producers: dict[str, int], name: str, matmul: int
) -> tuple[int, str, float] | None:
    """(the Mul's index, its tensor operand, its float scalar) when ``name`` is a Mul by a scalar
    constant that only this MatMul reads."""
    index = producers.get(name)
    if index is None or graph.nodes[index]["op"] != "Mul" or _only_reader(graph, readers, name) != matmul:
        return None
    mul = graph.nodes[index]
    for operand, other in ((mul["inputs"][0], mul["inputs"][1]), (mul["inputs"][1], mul["inputs"][0])):
        value = _scalar(graph, other)
        if value is not None and operand not in graph.tensors:
            return index, operand, value
    return None


run = merge_attention_scales
