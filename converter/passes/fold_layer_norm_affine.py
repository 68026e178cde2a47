"""A LayerNorm's scale and bias folded into the MatMuls that read it."""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _graph_outputs, _readers, _replace, _without
from converter.translate import FerryGraph


def fold_layer_norm_affine(graph: FerryGraph) -> FerryGraph:
    """LayerNorm(x) * scale + bias read only by MatMuls with constant weights (a pre-LN
    transformer's qkv and MLP inputs) -> LayerNorm with a unit scale and no bias, and each
    MatMul's weights W -> diag(scale) W and bias c -> bias @ W + c: the kernel then skips its
    two affine passes (see engine.ops.normalization.pack_layer_norm)."""
    readers = _readers(graph)
    tensors = dict(graph.tensors)
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        users = _affine_fold_users(graph, readers, index) if node["op"] == "LayerNormalization" else None
        if not users or any(user in changed for user in users):
            continue
        scale = graph.tensors[node["inputs"][1]].astype(np.float64)
        has_bias = len(node["inputs"]) > 2 and node["inputs"][2]
        shift = graph.tensors[node["inputs"][2]].astype(np.float64) if has_bias else np.zeros_like(scale)
        for user in users:
            changed[user] = _with_affine_folded(graph.nodes[user], tensors, scale, shift)
        unit = f"{node['inputs'][1]}@unit"
        tensors[unit] = np.ones_like(graph.tensors[node["inputs"][1]])
        changed[index] = {**node, "inputs": [node["inputs"][0], unit]}
    return _replace(_without(graph, set(), changed), tensors=tensors)


def _affine_fold_users(graph: FerryGraph, readers: dict[str, list[int]], index: int) -> list[int] | None:
    """The MatMul / FusedMatMul nodes reading this LayerNorm's only output, when they are all
    its readers, read it as A with their own constant 2-D weight (and constant bias), and the
    LayerNorm's scale and bias are constants that are not an identity already."""
    node = graph.nodes[index]
    inputs, outputs = node["inputs"], [name for name in node["outputs"] if name]
    rank = len(graph.shapes.get(inputs[0]) or [])
    if len(outputs) != 1 or len(node["outputs"]) != 1 or outputs[0] in _graph_outputs(graph):
        return None
    if int(node["attrs"].get("axis", -1)) not in (-1, rank - 1) or rank == 0:
        return None
    params = [graph.tensors.get(name) for name in inputs[1:] if name]
    if any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params) or len(params) != len(inputs) - 1:
        return None
    if any(p.shape != params[0].shape for p in params):  # a broadcast [1] scale or bias: left as is
        return None
    if np.all(params[0] == 1) and all(np.all(p == 0) for p in params[1:]):
        return None
    users = readers.get(outputs[0], [])
    if not users or len(set(users)) != len(users):
        return None
    width = params[0].shape[0]
    foldable = all(_foldable_reader(graph, readers, graph.nodes[user], outputs[0], width) for user in users)
    return users if foldable else None


def _foldable_reader(
    graph: FerryGraph, readers: dict[str, list[int]], reader: dict[str, Any], value: str, width: int
) -> bool:
    """A MatMul of ``value`` (as A) by its own constant [width, N] weight and constant bias.
    A weight shared with another node (tied embeddings) would be duplicated: not folded."""
    inputs = reader["inputs"]
    if reader["op"] not in ("MatMul", "FusedMatMul") or inputs[0] != value or len(inputs) < 2:
        return False
    weight = graph.tensors.get(inputs[1])
    if weight is None or weight.ndim != 2 or weight.shape[0] != width or weight.dtype.kind != "f":
        return False
    own = [name for name in inputs[1:] if name]
    return all(name in graph.tensors and len(readers.get(name, [])) == 1 for name in own)


def _with_affine_folded(
    node: dict[str, Any], tensors: dict[str, np.ndarray], scale: np.ndarray, shift: np.ndarray
) -> dict[str, Any]:
    """A MatMul reading LayerNorm(x) * scale + shift rewritten to read LayerNorm(x) itself."""
    weight_name = node["inputs"][1]
    weight = tensors[weight_name]
    bias_name = node["inputs"][2] if len(node["inputs"]) > 2 and node["inputs"][2] else None
    bias = tensors[bias_name].astype(np.float64) if bias_name else np.zeros(weight.shape[1])
    wide = weight.astype(np.float64)
    names = [f"{weight_name}@ln_folded", f"{bias_name or weight_name + '/bias'}@ln_folded"]
    tensors[names[0]] = (scale[:, None] * wide).astype(weight.dtype)
    tensors[names[1]] = (shift @ wide + bias).astype(weight.dtype)
    return {**node, "op": "FusedMatMul", "inputs": [node["inputs"][0], *names]}


run = fold_layer_norm_affine
