"""Rows nobody reads dropped from the last block of a classifier."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converter.lower import raster, region
from converter.passes.common import _graph_outputs, _producers, _readers, _replace
from converter.passes.fold_attention_views import MAX_VIEW_ELEMENTS, _movement
from converter.translate import FerryGraph
from engine.ops import REGISTRY

# Ops that compute each row (last axis) of their output from the same row of their inputs.
ROW_WISE_UNARY = frozenset({"Gelu", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Sqrt", "Neg", "Abs"})
ROW_WISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
ROW_WISE_OTHER = frozenset({"LayerNormalization", "FusedMatMul", "MatMul", "FusedAttention"})
ROW_WISE_OPS = ROW_WISE_UNARY | ROW_WISE_BINARY | ROW_WISE_OTHER


def narrow_rows(graph: FerryGraph) -> FerryGraph:
    """Compute only the rows a row selection reads: a ViT classifier reads the class token
    (row 0) of its last block, so that block's projection, MLP, residuals and LayerNorms run
    on one row, and its attention on one query, instead of all 197.  A Raster reading rows
    [r0, r1) of a [1.., S, E] value is followed up through producers that work row by row
    (LayerNorm over the last axis, MatMul by a constant, elementwise ops, FusedAttention's
    queries) as long as nothing else reads their results; what they read from outside that
    set is sliced to the same rows (a copy of n rows, by a new Raster)."""
    for index, node in enumerate(graph.nodes):
        if node["op"] == "Raster" and _movement(graph, node) and len(node["inputs"]) == 1:
            narrowed = _narrow_rows_before(graph, index)
            if narrowed is not None:
                return narrow_rows(narrowed)  # the graph changed: look again from the start
    return graph


def _narrow_rows_before(graph: FerryGraph, raster_index: int) -> FerryGraph | None:
    selector = graph.nodes[raster_index]
    source = selector["inputs"][0]
    producer = _producers(graph).get(source)
    layout = _row_layout(graph, source) if producer is not None else None
    if layout is None or graph.nodes[producer]["op"] not in ROW_WISE_OPS:
        return None  # checked first: the index map below costs time on large values
    rows = _rows_read(graph, selector, layout)
    if rows is None or rows[1] - rows[0] >= layout[0]:
        return None
    narrowed, sliced = _row_wise_region(graph, raster_index, source, layout[0])
    if not narrowed:
        return None
    return _apply_narrowing(graph, raster_index, narrowed, sliced, rows)


def _row_layout(graph: FerryGraph, name: str) -> tuple[int, int] | None:
    """(rows, row width) of a value of static shape [1.., S, E] (rows contiguous, of E elements)."""
    shape = graph.shapes.get(name)
    if shape is None or len(shape) < 2 or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return (int(shape[-2]), int(shape[-1])) if math.prod(shape[:-2]) == 1 else None


def _rows_read(
    graph: FerryGraph, selector: dict[str, Any], layout: tuple[int, int]
) -> tuple[int, int] | None:
    """The range [r0, r1) of the input rows a one-input Raster reads."""
    total = layout[0] * layout[1]
    if total > MAX_VIEW_ELEMENTS or math.prod(selector["attrs"]["shape"]) == 0:
        return None
    attrs = {key: value for key, value in selector["attrs"].items() if key != "dtype"}
    read = REGISTRY["Raster"]([np.arange(total, dtype=np.int64).reshape(layout)], attrs)[0]
    return int(read.min()) // layout[1], int(read.max()) // layout[1] + 1


def _row_wise_region(
    graph: FerryGraph, raster_index: int, source: str, rows: int
) -> tuple[set[int], set[str]]:
    """The nodes to narrow (each one's result read only by narrowed nodes or the selector, and
    by them only row by row) and the values they read from outside that must be sliced.
    Walking backwards in topological order sees every reader of a value before its producer."""
    readers, producers, outputs = _readers(graph), _producers(graph), _graph_outputs(graph)
    narrowed: set[int] = set()
    wanted, sliced = {source}, set()
    whole: set[str] = set()  # read in full by a narrowed node: an attention's keys and values
    for index in range(raster_index - 1, -1, -1):
        node = graph.nodes[index]
        out = [name for name in node["outputs"] if name]
        if len(out) != 1 or out[0] not in wanted:
            continue
        inside = all(r in narrowed or r == raster_index for r in readers.get(out[0], []))
        inside = inside and out[0] not in whole and out[0] not in outputs
        row_inputs = _row_inputs(graph, node, rows) if inside else None
        if row_inputs is None:
            wanted.discard(out[0])
            sliced.add(out[0])
            continue
        narrowed.add(index)
        wanted.update(row_inputs)
        if node["op"] == "FusedAttention":
            whole.update(name for name in node["inputs"][1:] if name)
    sliced |= {name for name in wanted if producers.get(name) not in narrowed}
    return narrowed, sliced - {source}


def _row_inputs(graph: FerryGraph, node: dict[str, Any], rows: int) -> list[str] | None:
    """The non-constant inputs whose rows the node's output rows come from, or None when the
    node does not work row by row (on [1.., rows, E] values)."""
    op, inputs = node["op"], node["inputs"]
    if _row_layout(graph, node["outputs"][0]) is None or graph.shapes[node["outputs"][0]][-2] != rows:
        return None
    if op == "FusedAttention":
        return _attention_row_inputs(graph, node, rows)
    if op in ("FusedMatMul", "MatMul"):
        constant = all(name in graph.tensors for name in inputs[1:] if name)
        ok = constant and graph.tensors[inputs[1]].ndim == 2
    elif op == "LayerNormalization":
        rank = len(graph.shapes[inputs[0]] or [])
        ok = int(node["attrs"].get("axis", -1)) in (-1, rank - 1)
        ok = ok and all(name in graph.tensors for name in inputs[1:] if name)
    elif op in ROW_WISE_UNARY:
        ok = len(inputs) == 1
    elif op in ROW_WISE_BINARY:
        shape = graph.shapes[node["outputs"][0]]
        ok = all(name in graph.tensors or graph.shapes.get(name) == shape for name in inputs)
        return [name for name in inputs if name not in graph.tensors] if ok else None
    else:
        return None
    return [inputs[0]] if ok and inputs[0] not in graph.tensors else None


def _attention_row_inputs(graph: FerryGraph, node: dict[str, Any], rows: int) -> list[str] | None:
    """Only the queries of a FusedAttention follow its output rows: [] when q is read through
    a view (whose rows, axis -2, get narrowed), [q] when q is a value of its own, None when
    it cannot be narrowed (a mask, q also read as k or v, or an out_view that does not write
    the queries' rows as the rows of a [1.., S, E] result)."""
    attrs, (q, k, v) = node["attrs"], node["inputs"][:3]
    views, out_view = attrs.get("views") or [None], attrs.get("out_view")
    if len(node["inputs"]) != 3:
        return None
    if out_view:
        shape, view = out_view["shape"], out_view["view"]
        if view["shape"][-2] != rows or view["strides"][-2] != shape[-1]:
            return None
    if views[0]:
        return [] if views[0]["shape"][-2] == rows else None
    if q in (k, v) or _row_layout(graph, q) is None or graph.shapes[q][-2] != rows:
        return None
    return [q]


def _apply_narrowing(
    graph: FerryGraph, raster_index: int, narrowed: set[int], sliced: set[str], rows: tuple[int, int]
) -> FerryGraph:
    first, last = rows
    count = last - first
    tensors, shapes = dict(graph.tensors), dict(graph.shapes)
    taken = set(shapes) | {name for node in graph.nodes for name in node["outputs"]}
    renamed = {name: _unused(f"{name}@rows{first}:{last}", taken) for name in sorted(sliced)}
    slicers: dict[int, list[dict[str, Any]]] = {}
    for name, new in renamed.items():
        before = min(i for i in narrowed if name in graph.nodes[i]["inputs"])
        shape, width = list(shapes[name]), shapes[name][-1]
        shape[-2] = count
        shapes[new] = shape
        rows_copy = region(0, first * width, [1], 0, [1], [count * width])
        slicers.setdefault(before, []).append(raster(f"{new}/slice", [name], new, shape, [rows_copy], None))
    nodes = []
    for index, node in enumerate(graph.nodes):
        nodes.extend(slicers.get(index, []))
        if index in narrowed:
            node = _narrowed_node(node, renamed, tensors, shapes, first, count)
        elif index == raster_index:
            node = _shifted_selector(node, first * shapes[node["inputs"][0]][-1])
        nodes.append(node)
    return _replace(graph, nodes=nodes, tensors=tensors, shapes=shapes)


def _unused(name: str, taken: set[str]) -> str:
    """``name``, or ``name#2``, ``name#3``... the first no value has yet (and now taken)."""
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{name}#{count}"
    taken.add(candidate)
    return candidate


def _narrowed_node(
    node: dict[str, Any],
    renamed: dict[str, str],
    tensors: dict[str, np.ndarray],
    shapes: dict[str, Any],
    first: int,
    count: int,
) -> dict[str, Any]:
    """The node computing rows [first, first + count) of what it computed (its output's shape
    changed in ``shapes``; constants with a row axis sliced into new tensors)."""
    out = node["outputs"][0]
    shape = list(shapes[out])
    shape[-2] = count
    shapes[out] = shape
    if node["op"] == "FusedAttention":
        return _narrowed_attention(node, renamed, shape, first, count)
    inputs = [renamed.get(name, name) for name in node["inputs"]]
    if node["op"] in ROW_WISE_BINARY:
        inputs = [_row_slice_constant(name, tensors, first, count) for name in inputs]
    return {**node, "inputs": inputs}


def _narrowed_attention(
    node: dict[str, Any], renamed: dict[str, str], shape: list[int], first: int, count: int
) -> dict[str, Any]:
    """Attention for queries [first, first + count) only: q's view (or q itself) narrowed, the
    keys and values as they were."""
    attrs, inputs = dict(node["attrs"]), list(node["inputs"])
    if attrs.get("views") and attrs["views"][0]:
        q = _fewer_rows(attrs["views"][0], count)
        q["offset"] += first * q["strides"][-2]
        attrs["views"] = [q, *attrs["views"][1:]]
    else:
        inputs[0] = renamed.get(inputs[0], inputs[0])
    if attrs.get("out_view"):
        view = _fewer_rows(attrs["out_view"]["view"], count)  # its offset is within a row: unchanged
        attrs["out_view"] = {"shape": shape, "view": view}
    return {**node, "inputs": inputs, "attrs": attrs}


def _fewer_rows(view: dict[str, Any], count: int) -> dict[str, Any]:
    return {**view, "shape": [*view["shape"][:-2], count, view["shape"][-1]]}


def _row_slice_constant(name: str, tensors: dict[str, np.ndarray], first: int, count: int) -> str:
    """A constant operand of a narrowed elementwise node: as is when it has no row axis of its
    own (broadcast over rows), else its rows [first, first + count) as a new tensor."""
    array = tensors.get(name)
    if array is None or array.ndim < 2 or array.shape[-2] == 1:
        return name
    new = f"{name}@rows{first}:{first + count}"
    tensors[new] = np.ascontiguousarray(array[..., first : first + count, :])
    return new


def _shifted_selector(node: dict[str, Any], offset: int) -> dict[str, Any]:
    """The selecting Raster reading the narrowed value (which starts ``offset`` elements later)."""
    regions = [{**r, "src_offset": int(r["src_offset"]) - offset} for r in node["attrs"]["regions"]]
    return {**node, "attrs": {**node["attrs"], "regions": regions}}


run = narrow_rows
