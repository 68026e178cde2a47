"""Shape arithmetic whose result is static although the graph's sizes are dynamic, folded.

torch's exporter computes values such as attention's scale from ``Shape`` of a tensor whose
batch and sequence dims are dynamic (``Sqrt(1 / Sqrt(Cast(Slice(Shape(q), -1))))``): the dims
it reads are static (the head width), but ONNX shape inference loses them once a ``Reshape``
takes its target from a computed ``Concat``, and ``fold_constants`` only folds a ``Shape`` whose
whole input shape is static.  This pass follows dims through Reshape (a partly known target),
Transpose and elementwise ops with a scalar constant, evaluates Shape, Gather, Slice, Unsqueeze,
Concat and Cast over partly known vectors, and folds every node whose result becomes fully
known and small (the later passes then see constants, e.g. the scale before a Softmax).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.passes.common import _graph_outputs, _replace
from converter.passes.fold_constants import NOT_FOLDED
from converter.translate import FerryGraph
from engine.ops import PREPARES, kernel_for

MAX_FOLDED_BYTES = 1024  # shape arithmetic is a few numbers; never fold a real tensor here
SCALAR_OPS = ("Mul", "Div", "Add", "Sub")
Dims = list[int | None]


class Partial:
    """A small integer vector of which some entries are unknown (None): a Shape's dims."""

    def __init__(self, values: np.ndarray, dtype: np.dtype) -> None:
        self.values, self.dtype = values, dtype  # values: object array

    def known(self) -> np.ndarray | None:
        if any(v is None for v in self.values.reshape(-1)):
            return None
        return np.array(self.values.tolist(), dtype=self.dtype).reshape(self.values.shape)


def fold_shape_values(graph: FerryGraph) -> FerryGraph:
    """Fold the nodes whose outputs are computable from static dims and constants alone."""
    tensors, outputs = dict(graph.tensors), _graph_outputs(graph)
    dims: dict[str, Dims] = {}
    partial: dict[str, Partial] = {}
    nodes = []
    for node in graph.nodes:
        _refine_dims(graph, node, tensors, partial, dims)
        folded = None
        if node["op"] not in NOT_FOLDED and not set(node["outputs"]) & outputs:
            folded = _evaluate(graph, node, tensors, partial, dims)
        if folded is None:
            nodes.append(node)
            continue
        for name, value in folded.items():
            if isinstance(value, Partial):
                partial[name] = value
            else:
                tensors[name] = value
        if any(isinstance(v, Partial) for v in folded.values()):
            nodes.append(node)  # still computed at run time; its known entries help later nodes
    return _replace(graph, nodes=nodes, tensors=tensors)


def _dims_of(graph: FerryGraph, name: str, dims: dict[str, Dims]) -> Dims | None:
    inferred = graph.shapes.get(name)
    base = None if inferred is None else [d if isinstance(d, int) else None for d in inferred]
    refined = dims.get(name)
    if base is None or refined is None or len(base) != len(refined):
        return refined if refined is not None else base
    return [b if b is not None else r for b, r in zip(base, refined, strict=True)]


def _refine_dims(
    graph: FerryGraph, node: dict[str, Any], tensors: dict, partial: dict[str, Partial], dims: dict[str, Dims]
) -> None:
    """Dims of the node's output that inference left symbolic but its inputs fix."""
    op, inputs, out = node["op"], node["inputs"], node["outputs"][0] if node["outputs"] else ""
    found: Dims | None = None
    if op == "Transpose":
        source = _dims_of(graph, inputs[0], dims)
        perm = node["attrs"].get("perm")
        if source is not None and perm is not None and len(perm) == len(source):
            found = [source[p] for p in perm]
    elif op == "Reshape":
        found = _reshaped(graph, node, tensors, partial, dims)
    elif op in SCALAR_OPS and len(inputs) == 2:
        for this, other in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
            constant = tensors.get(other)
            if constant is not None and constant.size == 1:
                found = _dims_of(graph, this, dims)
                if found is not None and constant.ndim > len(found):
                    found = None  # the constant's rank widens the result
                break
    if found is not None and out:
        dims[out] = found


def _reshaped(
    graph: FerryGraph, node: dict[str, Any], tensors: dict, partial: dict[str, Partial], dims: dict[str, Dims]
) -> Dims | None:
    target_name = node["inputs"][1]
    target = tensors.get(target_name)
    entries = target.reshape(-1).tolist() if target is not None else None
    if entries is None and target_name in partial:
        entries = partial[target_name].values.reshape(-1).tolist()
    if entries is None:
        return None
    source = _dims_of(graph, node["inputs"][0], dims)
    allow_zero = int(node["attrs"].get("allowzero", 0))
    found: Dims = []
    for i, entry in enumerate(entries):
        if entry is None or entry == -1:
            found.append(None)
        elif entry == 0 and not allow_zero:
            found.append(source[i] if source is not None and i < len(source) else None)
        else:
            found.append(int(entry))
    return found


def _evaluate(
    graph: FerryGraph, node: dict[str, Any], tensors: dict, partial: dict[str, Partial], dims: dict[str, Dims]
) -> dict[str, np.ndarray | Partial] | None:
    op, inputs = node["op"], node["inputs"]
    if op == "Shape" and inputs[0] not in tensors:
        return _shape(graph, node, dims)
    if any(name and name not in tensors and name not in partial for name in inputs):
        return None
    if any(name in partial for name in inputs):
        try:
            result = _on_partial(node, tensors, partial)
        except (IndexError, ValueError, TypeError):  # e.g. an index past the vector: fails at run time too
            return None
        if result is None:
            return None
        known = result.known()
        return {node["outputs"][0]: known if known is not None else result}
    return _kernel(graph, node, tensors)


def _shape(graph: FerryGraph, node: dict[str, Any], dims: dict[str, Dims]) -> dict | None:
    source = _dims_of(graph, node["inputs"][0], dims)
    if source is None:
        return None
    rank = len(source)
    start, end = int(node["attrs"].get("start", 0)), node["attrs"].get("end")
    picked = source[slice(start, int(end) if end is not None else rank)]
    value = Partial(np.array(picked, dtype=object), np.dtype(np.int64))
    known = value.known()
    return {node["outputs"][0]: known if known is not None else value}


def _as_partial(name: str, tensors: dict, partial: dict[str, Partial]) -> Partial:
    if name in partial:
        return partial[name]
    array = tensors[name]
    return Partial(np.array(array.tolist(), dtype=object).reshape(array.shape), array.dtype)


def _on_partial(node: dict[str, Any], tensors: dict, partial: dict[str, Partial]) -> Partial | None:
    """Gather, Slice, Unsqueeze, Squeeze, Concat, Cast over vectors with unknown entries."""
    op, inputs, attrs = node["op"], node["inputs"], node["attrs"]
    data = _as_partial(inputs[0], tensors, partial)
    if op == "Concat" and int(attrs.get("axis", 0)) in (0, -1):  # any of its inputs may be partial
        parts = [_as_partial(name, tensors, partial) for name in inputs]
        if any(p.values.ndim != 1 for p in parts):
            return None
        return Partial(np.concatenate([p.values for p in parts]), data.dtype)
    rest = [tensors.get(name) for name in inputs[1:]]
    if any(value is None for value in rest) or data.values.ndim > 1:
        return None  # only the data input may be partly known, and only a vector (no empty inputs)
    if op == "Gather" and int(attrs.get("axis", 0)) == 0:
        picked = data.values[rest[0].astype(np.int64)]
        return Partial(np.asarray(picked, dtype=object).reshape(rest[0].shape), data.dtype)
    if op == "Slice" and len(rest) >= 2 and all(r.size == 1 for r in rest):
        step = int(rest[3].reshape(-1)[0]) if len(rest) > 3 else 1
        if len(rest) > 2 and int(rest[2].reshape(-1)[0]) not in (0, -1):
            return None
        begin, stop = int(rest[0].reshape(-1)[0]), int(rest[1].reshape(-1)[0])
        return Partial(data.values[begin:stop:step], data.dtype)
    if op == "Unsqueeze" and data.values.ndim == 0:
        return Partial(data.values.reshape(1), data.dtype)
    if op == "Squeeze" and data.values.size == 1:
        return Partial(data.values.reshape(()), data.dtype)
    if op == "Cast":
        return Partial(data.values, _cast_dtype(attrs))
    return None


def _as_inferred(graph: FerryGraph, name: str, value: np.ndarray) -> np.ndarray:
    """The engine's kernels may return a 0-d result as [1]; keep the rank inference gave it."""
    shape = graph.shapes.get(name)
    if shape is not None and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == value.size:
        return value.reshape(shape)
    return value


def _cast_dtype(attrs: dict[str, Any]) -> np.dtype:
    from onnx import helper  # noqa: PLC0415 - only needed for a Cast of a partial vector

    return np.dtype(helper.tensor_dtype_to_np_dtype(int(attrs["to"])))


def _kernel(graph: FerryGraph, node: dict[str, Any], tensors: dict) -> dict[str, np.ndarray] | None:
    """A node whose inputs are all known, computed with the engine's kernel when its result is
    small (fold_constants did the rest before this pass)."""
    names = [name for name in node["outputs"] if name]
    kernel = kernel_for(node["op"], graph.opset)
    if kernel is None or not names or not node["inputs"]:
        return None
    args = [tensors[name] if name else None for name in node["inputs"]]
    if sum(int(a.nbytes) for a in args if a is not None) > 8 * MAX_FOLDED_BYTES:
        return None
    attrs = dict(node["attrs"])
    if node["op"] in PREPARES:
        attrs = PREPARES[node["op"]](attrs, len(node["inputs"]), len(node["outputs"]))
    try:
        results = kernel(args, attrs)
    except Exception:  # noqa: BLE001 - a node that fails on constants fails at run time too; leave it
        return None
    produced = {
        n: _as_inferred(graph, n, np.ascontiguousarray(v))
        for n, v in zip(node["outputs"], results, strict=False)
        if n
    }
    if sum(v.nbytes for v in produced.values()) > MAX_FOLDED_BYTES:
        return None
    return produced


run = fold_shape_values
