"""BatchNormalization after a Conv or ConvTranspose folded into its weights and bias."""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _only_reader, _producers, _readers, _replace, _without
from converter.translate import FerryGraph


def fold_batch_norm(graph: FerryGraph) -> FerryGraph:
    """BatchNormalization right after a Conv or ConvTranspose with constant weights -> new
    weights and bias."""
    readers, producers = _readers(graph), _producers(graph)
    tensors = dict(graph.tensors)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, bn in enumerate(graph.nodes):
        if bn["op"] != "BatchNormalization" or len([o for o in bn["outputs"] if o]) != 1:
            continue
        if bn["attrs"].get("training_mode", 0):
            continue  # normalises with the batch's own statistics: nothing to fold
        conv_index = producers.get(bn["inputs"][0])
        params = [tensors.get(name) for name in bn["inputs"][1:5]]
        if conv_index is None or any(p is None for p in params) or conv_index in changed:
            continue
        conv = graph.nodes[conv_index]
        weight = tensors.get(conv["inputs"][1]) if conv["op"] in ("Conv", "ConvTranspose") else None
        if weight is None or _only_reader(graph, readers, bn["inputs"][0]) != index:
            continue
        if len(readers.get(conv["inputs"][1], [])) != 1:
            continue  # the weight is shared with another node
        scale, offset, mean, var = (p.astype(np.float64) for p in params)
        factor = scale / np.sqrt(var + float(bn["attrs"].get("epsilon", 1e-5)))
        bias_name = conv["inputs"][2] if len(conv["inputs"]) > 2 and conv["inputs"][2] else None
        old_bias = tensors[bias_name].astype(np.float64) if bias_name else np.zeros_like(mean)
        new_weight = _scaled_per_output_channel(weight, factor, conv)
        if new_weight is None:
            continue
        w_name, b_name = f"{conv['name']}/bn_weight", f"{conv['name']}/bn_bias"
        tensors[w_name] = new_weight.astype(weight.dtype)
        tensors[b_name] = ((old_bias - mean) * factor + offset).astype(weight.dtype)
        changed[conv_index] = {
            **conv,
            "inputs": [conv["inputs"][0], w_name, b_name],
            "outputs": [bn["outputs"][0]],
        }
        drop.add(index)
    return _replace(_without(graph, drop, changed), tensors=tensors)


def _scaled_per_output_channel(
    weight: np.ndarray, factor: np.ndarray, conv: dict[str, Any]
) -> np.ndarray | None:
    """A Conv's weight (M, C/g, k...) or a ConvTranspose's (C, M/g, k...) with each output
    channel's filter times its factor (float64), or None if the shapes do not agree."""
    if conv["op"] == "Conv":
        if weight.ndim < 2 or weight.shape[0] != factor.size:
            return None
        return weight.astype(np.float64) * factor.reshape(-1, *([1] * (weight.ndim - 1)))
    group = int(conv["attrs"].get("group", 1))
    if weight.ndim < 2 or weight.shape[0] % group or weight.shape[1] * group != factor.size:
        return None
    grouped = weight.astype(np.float64).reshape(group, weight.shape[0] // group, *weight.shape[1:])
    spread = factor.reshape(group, 1, weight.shape[1], *([1] * (weight.ndim - 2)))
    return (grouped * spread).reshape(weight.shape)


run = fold_batch_norm
