"""The head split and merge Rasters around attention folded into it as strided views."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converter.passes.common import _graph_outputs, _only_reader, _producers, _readers, _without
from converter.translate import FerryGraph
from engine.ops import REGISTRY

MOVEMENT_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
MAX_VIEW_ELEMENTS = 1 << 22  # index maps are checked on every element: cap the cost


def fold_attention_views(graph: FerryGraph) -> FerryGraph:
    """FusedAttention reads q, k, v as strided views of the tensor the Raster chains before it
    copy them out of (the head split of a packed qkv projection: a transpose and three
    gathers), and writes its result straight into the layout of a single Raster after it
    (the head merge), when each of those index maps is affine; checked exactly on indices."""
    readers, producers = _readers(graph), _producers(graph)
    outputs = _graph_outputs(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "FusedAttention" or node["attrs"].get("views") or node["attrs"].get("out_view"):
            continue
        inputs, attrs = list(node["inputs"]), dict(node["attrs"])
        views: list[dict[str, Any] | None] = [None, None, None]
        for position in range(3):
            found = _input_view(graph, producers, inputs[position])
            if found is not None:
                inputs[position], views[position] = found
        if any(views):
            attrs["views"] = views
        out_index = _only_reader(graph, readers, node["outputs"][0])
        merge = graph.nodes[out_index] if out_index is not None else None
        out_view = _output_view(graph, node["outputs"][0], merge) if merge is not None else None
        if out_view is not None and node["outputs"][0] not in outputs:
            attrs["out_view"] = out_view
            drop.add(out_index)
            changed[index] = {**node, "inputs": inputs, "attrs": attrs, "outputs": list(merge["outputs"])}
        elif any(views):
            changed[index] = {**node, "inputs": inputs, "attrs": attrs}
    return _without(graph, drop, changed)


def _known_shape(graph: FerryGraph, producers: dict[str, int], name: str) -> list[int] | None:
    index = producers.get(name)
    if index is not None and graph.nodes[index]["op"] == "Raster":
        return [int(d) for d in graph.nodes[index]["attrs"]["shape"]]
    shape = graph.tensors[name].shape if name in graph.tensors else graph.shapes.get(name)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape]


def _movement(graph: FerryGraph, node: dict[str, Any]) -> bool:
    """A node that only moves its first input's elements: a one-input Raster or a reshape."""
    if node["op"] == "Raster":
        regions = node["attrs"]["regions"]
        return "fill" not in node["attrs"] and all(int(r["input"]) == 0 for r in regions)
    return node["op"] in MOVEMENT_VIEWS


def _input_view(graph: FerryGraph, producers: dict[str, int], name: str) -> tuple[str, dict[str, Any]] | None:
    """(source, view) when ``name`` is a strided view of ``source`` made by a chain of data
    movement with at least one copying Raster in it."""
    chain: list[dict[str, Any]] = []
    source = name
    while source in producers and _movement(graph, graph.nodes[producers[source]]):
        chain.append(graph.nodes[producers[source]])
        source = chain[-1]["inputs"][0]
    if not any(n["op"] == "Raster" for n in chain) or source in graph.tensors:
        return None
    shape = _known_shape(graph, producers, source)
    if shape is None or math.prod(shape) > MAX_VIEW_ELEMENTS:
        return None
    index_map = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    for node in reversed(chain):
        index_map = _apply_movement(graph, producers, node, index_map)
        if index_map is None:
            return None
    affine = _affine(index_map)
    return None if affine is None else (source, affine)


def _apply_movement(
    graph: FerryGraph, producers: dict[str, int], node: dict[str, Any], index_map: np.ndarray
) -> np.ndarray | None:
    if node["op"] == "Raster":
        attrs = {key: value for key, value in node["attrs"].items() if key != "dtype"}
        return REGISTRY["Raster"]([index_map], attrs)[0]
    shape = _known_shape(graph, producers, node["outputs"][0])
    if shape is None or math.prod(shape) != index_map.size:
        return None
    return index_map.reshape(shape)


def _output_view(graph: FerryGraph, name: str, merge: dict[str, Any]) -> dict[str, Any] | None:
    """{"shape": merge's output shape, "view": where each attention output element lands in
    it} when ``merge`` is a one-input Raster permuting the attention output affinely."""
    if merge["op"] != "Raster" or not _movement(graph, merge) or merge["inputs"][0] != name:
        return None
    shape = graph.shapes.get(name)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    total = math.prod(shape)
    if total > MAX_VIEW_ELEMENTS or math.prod(merge["attrs"]["shape"]) != total:
        return None
    attrs = {key: value for key, value in merge["attrs"].items() if key != "dtype"}
    moved = REGISTRY["Raster"]([np.arange(total, dtype=np.int64).reshape(shape)], attrs)[0].reshape(-1)
    if not np.array_equal(np.sort(moved), np.arange(total)):
        return None  # not a permutation: some element copied twice or dropped
    where = np.empty(total, dtype=np.int64)
    where[moved] = np.arange(total)
    affine = _affine(where.reshape(shape))
    return None if affine is None else {"shape": list(merge["attrs"]["shape"]), "view": affine}


def _affine(index_map: np.ndarray) -> dict[str, Any] | None:
    """{"shape", "offset", "strides"} when index_map[k] = offset + sum(k_i * strides_i), with
    non-negative strides (what engine.ops.fused reads as a view)."""
    if index_map.size == 0:
        return None
    offset = int(index_map.reshape(-1)[0])
    strides = []
    expected = np.full(index_map.shape, offset, dtype=np.int64)
    for axis, count in enumerate(index_map.shape):
        stride = int(np.take(index_map, 1, axis=axis).reshape(-1)[0]) - offset if count > 1 else 0
        if stride < 0:
            return None
        strides.append(stride)
        along = [-1 if other == axis else 1 for other in range(index_map.ndim)]
        expected += np.arange(count, dtype=np.int64).reshape(along) * stride
    if not np.array_equal(expected, index_map):
        return None
    return {"shape": list(index_map.shape), "offset": offset, "strides": strides}


run = fold_attention_views
