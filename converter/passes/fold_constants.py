"""Constant folding with the engine's own kernels, bounded so the package never grows much."""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _graph_outputs, _replace
from converter.translate import FerryGraph
from engine.ops import PREPARES, kernel_for

# Constant folding never makes the package grow much: a folded result may be at most this
# many times the bytes of the tensors it replaces (plus a little), so e.g. a user's int8
# DequantizeLinear weights are not expanded back to float32.
FOLD_GROWTH, FOLD_SLACK_BYTES = 2, 4096
NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}


def fold_constants(graph: FerryGraph) -> FerryGraph:
    """Compute nodes whose inputs are all constants (with the engine's own kernels) once, now;
    Shape of a value with a fully static inferred shape counts as a constant."""
    tensors = dict(graph.tensors)
    outputs = _graph_outputs(graph)
    nodes = []
    for node in graph.nodes:
        folded = _fold(node, tensors, graph.opset, outputs, graph.shapes)
        if folded is None:
            nodes.append(node)
        else:
            tensors.update(folded)
    return _replace(graph, nodes=nodes, tensors=tensors)


def _static_shape(
    node: dict[str, Any], shapes: dict[str, list[int | str] | None]
) -> dict[str, np.ndarray] | None:
    """Shape of a value whose inferred shape has no symbolic dim: a constant (so what is computed
    from it, e.g. a Reshape's target, folds too)."""
    shape = shapes.get(node["inputs"][0])
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    rank = len(shape)
    start, end = int(node["attrs"].get("start", 0)), node["attrs"].get("end")
    dims = shape[slice(start, int(end) if end is not None else rank)]
    return {node["outputs"][0]: np.array(dims, dtype=np.int64)}


def _fold(
    node: dict[str, Any],
    tensors: dict[str, np.ndarray],
    opset: int,
    outputs: set[str],
    shapes: dict[str, list[int | str] | None],
) -> dict[str, np.ndarray] | None:
    names = [name for name in node["outputs"] if name]
    if node["op"] in NOT_FOLDED or any(name in outputs for name in names) or not names:
        return None
    if node["op"] == "Shape" and node["inputs"][0] not in tensors:
        return _static_shape(node, shapes)
    if not all(name == "" or name in tensors for name in node["inputs"]):
        return None
    kernel = kernel_for(node["op"], opset)
    if kernel is None:
        return None
    attrs = dict(node["attrs"])
    if node["op"] in PREPARES:
        attrs = PREPARES[node["op"]](attrs, len(node["inputs"]), len(node["outputs"]))
    args = [tensors[name] if name else None for name in node["inputs"]]
    try:
        results = kernel(args, attrs)
    except Exception:  # noqa: BLE001 - a node that fails on constants fails at run time too; leave it
        return None
    budget = FOLD_GROWTH * sum(int(a.nbytes) for a in args if a is not None) + FOLD_SLACK_BYTES
    produced = {
        name: np.ascontiguousarray(value)
        for name, value in zip(node["outputs"], results, strict=False)
        if name
    }
    if sum(v.nbytes for v in produced.values()) > budget:
        return None
    return produced


run = fold_constants
