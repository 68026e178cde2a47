"""Lowering data movement to Raster (MNN's "geometry computing").

Transpose, Slice, Concat, Pad (constant), Expand, Gather (constant indices), Split and the
reshape family (Reshape, Flatten, Squeeze, Unsqueeze) become ``Raster`` nodes: lists of strided
copies (see engine/ops/raster.py) computed here from the static shapes shape inference gave.
A node with any dynamic (symbolic) dim, or non-constant shape/index inputs, is left as it is.
Then a Raster whose only reader is another Raster is merged into it when the composed index
map is again strided (Transpose -> Transpose, Reshape -> Transpose -> Reshape...), checked
exactly on the indices.  A Raster left doing nothing but a reshape (a whole, in-order copy)
becomes a Reshape again, the original node when it was one: the engine runs that as a free view.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converter.translate import FerryGraph, json_float
from engine.ops.common import ONNX_DTYPES

Region = dict[str, Any]
LOWERED = ("Transpose", "Slice", "Concat", "Pad", "Expand", "Gather", "Split")
VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
# ops whose outputs have their first input's dtype, and ops of a fixed output dtype: enough to
# give most Rasters their dtype attribute (without it, a Raster takes its input's dtype)
SAME_DTYPE = frozenset({
    "Abs", "Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "Div", "Dropout",
    "Erf", "Exp", "Expand", "Flatten", "FusedAttention", "FusedConv", "FusedGemm", "FusedMatMul",
    "Gather", "Gelu", "Gemm", "GlobalAveragePool", "HardSigmoid", "HardSwish", "Identity",
    "LayerNormalization", "LeakyRelu", "Log", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg",
    "Pad", "Pow", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape", "Sigmoid",
    "Slice", "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Unsqueeze",
})  # fmt: skip
FIXED_DTYPE = {
    **dict.fromkeys(("Shape", "Size", "ArgMax", "ArgMin", "NonZero"), "int64"),
    **dict.fromkeys(
        ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or"), "bool"
    ),
}
MAX_GATHER_REGIONS = 16  # more runs of indices than this: the Gather kernel does better
MAX_MERGE_ELEMENTS = 1 << 22  # merging checks the composed map on every index: cap its cost


def c_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return list(reversed(strides))


def region(index: int, src_offset: int, src_strides, dst_offset: int, dst_strides, size) -> Region:
    """A region with size-1 dims dropped and adjacent dims merged where both sides allow."""
    dims = [
        (int(n), int(s), int(d)) for n, s, d in zip(size, src_strides, dst_strides, strict=True) if n != 1
    ]
    if any(n == 0 for n, _, _ in dims):
        dims = [(0, 0, 0)]
    merged: list[tuple[int, int, int]] = []
    for n, s, d in dims:
        if merged and merged[-1][1] == s * n and merged[-1][2] == d * n:
            outer = merged.pop()
            n, s, d = outer[0] * n, s, d
        merged.append((n, s, d))
    return {
        "input": index,
        "src_offset": int(src_offset),
        "src_strides": [s for _, s, _ in merged],
        "dst_offset": int(dst_offset),
        "dst_strides": [d for _, _, d in merged],
        "size": [n for n, _, _ in merged],
    }


def raster(name: str, inputs: list[str], output: str, shape, regions, dtype, fill=None) -> dict[str, Any]:
    attrs: dict[str, Any] = {"shape": [int(d) for d in shape], "regions": regions}
    if dtype is not None:
        attrs["dtype"] = dtype
    if fill is not None:
        attrs["fill"] = fill
    return {"name": name, "op": "Raster", "inputs": inputs, "outputs": [output], "attrs": attrs}


class _Context:
    def __init__(self, graph: FerryGraph) -> None:
        self.graph = graph
        self.dtypes: dict[str, str] = {spec["name"]: spec["dtype"] for spec in graph.inputs}
        self.dtypes.update({name: array.dtype.name for name, array in graph.tensors.items()})

    def shape(self, name: str) -> list[int] | None:
        if name in self.graph.tensors:
            return list(self.graph.tensors[name].shape)
        shape = self.graph.shapes.get(name)
        if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        return list(shape)

    def const(self, node: dict[str, Any], position: int) -> list[int] | None | bool:
        """Input ``position`` as an int list; None when omitted; False when not a constant."""
        if len(node["inputs"]) <= position or not node["inputs"][position]:
            return None
        array = self.graph.tensors.get(node["inputs"][position])
        if array is None:
            return False
        return [int(v) for v in array.reshape(-1)]

    def follow(self, node: dict[str, Any]) -> None:
        """Note the dtype of a node's outputs, where the op tells it."""
        if node["op"] in SAME_DTYPE and node["inputs"] and node["inputs"][0] in self.dtypes:
            dtype = self.dtypes[node["inputs"][0]]
        elif node["op"] == "Cast" and int(node["attrs"].get("to", 0)) in ONNX_DTYPES:
            dtype = ONNX_DTYPES[int(node["attrs"]["to"])].name
        else:
            dtype = FIXED_DTYPE.get(node["op"])
        outputs = node["outputs"] if node["op"] == "Split" else node["outputs"][:1]  # not MaxPool's indices
        for name in outputs if dtype else ():
            if name:
                self.dtypes[name] = dtype


def lower_node(node: dict[str, Any], ctx: _Context) -> list[dict[str, Any]] | None:
    """The Raster node(s) replacing ``node``, or None to leave it."""
    op = node["op"]
    if op not in LOWERED and op not in VIEWS or not node["inputs"] or not node["inputs"][0]:
        return None
    x = node["inputs"][0]
    shape = ctx.shape(x)
    outputs = [name for name in node["outputs"] if name]
    if shape is None or not outputs or any(ctx.shape(name) is None for name in outputs):
        return None
    dtype = ctx.dtypes.get(x)
    try:
        made = _LOWER[op](node, ctx, shape)
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError):
        return None  # whatever the engine kernel would make of it, it still does at run time
    if made is None:
        return None
    nodes = []
    for output, (inputs, out_shape, regions, fill) in made.items():
        if out_shape != ctx.shape(output):
            return None  # not what shape inference says: leave the node to its kernel
        name = node["name"] if len(made) == 1 else f"{node['name']}/{output}"
        nodes.append(raster(name, inputs, output, out_shape, regions, dtype, fill))
        if dtype is not None:
            ctx.dtypes[output] = dtype
    return nodes


Made = dict[str, tuple[list[str], list[int], list[Region], Any]]


def _view(node, ctx, shape) -> Made:
    out = ctx.shape(node["outputs"][0])
    if math.prod(out) != math.prod(shape):
        return None
    total = math.prod(shape)
    return {node["outputs"][0]: ([node["inputs"][0]], out, [region(0, 0, [1], 0, [1], [total])], None)}


def _transpose(node, ctx, shape) -> Made:
    perm = node["attrs"].get("perm") or list(reversed(range(len(shape))))
    out = [shape[p] for p in perm]
    strides = c_strides(shape)
    regions = [region(0, 0, [strides[p] for p in perm], 0, c_strides(out), out)]
    return {node["outputs"][0]: ([node["inputs"][0]], out, regions, None)}


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(axis)
    return axis + rank if axis < 0 else axis


def _slices(shape, starts, ends, axes, steps) -> tuple[list[int], list[int], list[int]]:
    """Per axis: first index, step and count of an ONNX Slice (negatives, clamping)."""
    first, step, count = [0] * len(shape), [1] * len(shape), list(shape)
    for start, end, axis, st in zip(starts, ends, axes, steps, strict=True):
        axis, dim = _axis(axis, len(shape)), shape[axis]
        if st == 0:
            raise ValueError("step 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if st > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            n = max(0, -(-(end - start) // st))
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            n = max(0, -(-(start - end) // -st))
        first[axis], step[axis], count[axis] = start if n else 0, st, n
    return first, step, count


def _slice(node, ctx, shape) -> Made:
    starts, ends, axes, steps = (ctx.const(node, i) for i in (1, 2, 3, 4))
    if starts in (None, False) or ends in (None, False) or axes is False or steps is False:
        return None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    first, step, count = _slices(shape, starts, ends, axes, steps)
    strides = c_strides(shape)
    offset = sum(f * s for f, s in zip(first, strides, strict=True))
    regions = [
        region(0, offset, [st * s for st, s in zip(step, strides, strict=True)], 0, c_strides(count), count)
    ]
    return {node["outputs"][0]: ([node["inputs"][0]], count, regions, None)}


def _concat(node, ctx, shape) -> Made:
    names = [name for name in node["inputs"] if name]
    shapes = [ctx.shape(name) for name in names]
    if any(s is None for s in shapes):
        return None
    axis = _axis(int(node["attrs"]["axis"]), len(shape))
    out = list(shape)
    out[axis] = sum(s[axis] for s in shapes)
    dst = c_strides(out)
    regions, at = [], 0
    for index, part in enumerate(shapes):
        if math.prod(part):
            regions.append(region(index, 0, c_strides(part), at * dst[axis], dst, part))
        at += part[axis]
    return {node["outputs"][0]: (names, out, regions, None)}


def _pad(node, ctx, shape) -> Made:
    if node["attrs"].get("mode", "constant") != "constant":
        return None
    pads, axes = ctx.const(node, 1), ctx.const(node, 3)
    if pads in (None, False) or axes is False:
        return None
    value = None
    if len(node["inputs"]) > 2 and node["inputs"][2]:
        array = ctx.graph.tensors.get(node["inputs"][2])
        if array is None:
            return None
        if array.size:
            value = array.reshape(-1)[0].item()
    axes = [_axis(a, len(shape)) for a in (axes if axes is not None else range(len(shape)))]
    begin, end = [0] * len(shape), [0] * len(shape)
    for i, axis in enumerate(axes):
        begin[axis], end[axis] = pads[i], pads[len(axes) + i]
    kept = [d - max(-b, 0) - max(-e, 0) for d, b, e in zip(shape, begin, end, strict=True)]
    out = [k + max(b, 0) + max(e, 0) for k, b, e in zip(kept, begin, end, strict=True)]
    if any(k < 0 for k in kept):
        return None
    src, dst = c_strides(shape), c_strides(out)
    src_offset = sum(max(-b, 0) * s for b, s in zip(begin, src, strict=True))
    dst_offset = sum(max(b, 0) * d for b, d in zip(begin, dst, strict=True))
    regions = [region(0, src_offset, src, dst_offset, dst, kept)] if math.prod(kept) else []
    fill = 0 if value is None else (json_float(value) if isinstance(value, float) else value)
    if isinstance(fill, bool):
        fill = int(fill)
    if regions and math.prod(kept) == math.prod(out):
        fill = None  # nothing left to fill: a crop
    return {node["outputs"][0]: ([node["inputs"][0]], out, regions, fill)}


def _expand(node, ctx, shape) -> Made:
    dims = ctx.const(node, 1)
    if dims in (None, False):
        return None
    out = list(np.broadcast_shapes(tuple(shape), tuple(dims)))
    rank = len(out)
    src = [0] * (rank - len(shape)) + c_strides(shape)
    padded = [1] * (rank - len(shape)) + shape
    strides = [0 if n == 1 and o != 1 else s for n, o, s in zip(padded, out, src, strict=True)]
    regions = [region(0, 0, strides, 0, c_strides(out), out)]
    return {node["outputs"][0]: ([node["inputs"][0]], out, regions, None)}


def _runs(indices: list[int]) -> list[tuple[int, int, int]]:
    """(first, step, count) arithmetic runs covering ``indices`` in order."""
    runs: list[tuple[int, int, int]] = []
    for value in indices:
        if runs:
            first, step, count = runs[-1]
            if count == 1:
                runs[-1] = (first, value - first, 2)
                continue
            if value == first + step * count:
                runs[-1] = (first, step, count + 1)
                continue
        runs.append((value, 1, 1))
    return runs


def _gather(node, ctx, shape) -> Made:
    array = ctx.graph.tensors.get(node["inputs"][1])
    if array is None or array.ndim > 1 or array.dtype.kind not in "iu":
        return None
    axis = _axis(int(node["attrs"].get("axis", 0)), len(shape))
    dim = shape[axis]
    indices = [int(v) for v in array.reshape(-1)]
    if any(not -dim <= i < dim for i in indices):
        return None  # out of range: the kernel's error, at run time
    indices = [i + dim if i < 0 else i for i in indices]
    src = c_strides(shape)
    outer, inner = shape[:axis], shape[axis + 1 :]
    if array.ndim == 0:
        out = outer + inner
        regions = [region(0, indices[0] * src[axis], src[:axis] + src[axis + 1 :], 0, c_strides(out), out)]
        return {node["outputs"][0]: ([node["inputs"][0]], out, regions, None)}
    out = [*outer, len(indices), *inner]
    dst = c_strides(out)
    runs = _runs(indices)
    if len(runs) > MAX_GATHER_REGIONS:
        return None
    regions, at = [], 0
    for first, step, count in runs:
        sizes = [*outer, count, *inner]
        src_strides = [*src[:axis], step * src[axis], *src[axis + 1 :]]
        regions.append(region(0, first * src[axis], src_strides, at * dst[axis], dst, sizes))
        at += count
    return {node["outputs"][0]: ([node["inputs"][0]], out, regions, None)}


def _split(node, ctx, shape) -> Made:
    axis = _axis(int(node["attrs"].get("axis", 0)), len(shape))
    sizes = ctx.const(node, 1)
    if sizes is False:
        return None
    sizes = sizes or node["attrs"].get("split")
    if not sizes:
        parts = int(node["attrs"].get("num_outputs", len(node["outputs"])))
        chunk = -(-shape[axis] // parts)
        sizes = [min(chunk, max(shape[axis] - i * chunk, 0)) for i in range(parts)]
    if sum(sizes) != shape[axis] or len(sizes) != len(node["outputs"]):
        return None
    src = c_strides(shape)
    made, at = {}, 0
    for output, n in zip(node["outputs"], sizes, strict=True):
        out = list(shape)
        out[axis] = n
        if output:
            regions = [region(0, at * src[axis], src, 0, c_strides(out), out)] if math.prod(out) else []
            made[output] = ([node["inputs"][0]], out, regions, None)
        at += n
    return made


_LOWER = {
    "Transpose": _transpose,
    "Slice": _slice,
    "Concat": _concat,
    "Pad": _pad,
    "Expand": _expand,
    "Gather": _gather,
    "Split": _split,
    **dict.fromkeys(VIEWS, _view),
}


# --- merging ----------------------------------------------------------------------------------


def _single_dense(node: dict[str, Any]) -> Region | None:
    """The region of a Raster that is one strided read written densely in C order over its
    whole output (a view of its input: what a consumer can be composed with)."""
    attrs = node["attrs"]
    if "fill" in attrs or len(attrs["regions"]) != 1:
        return None
    only = attrs["regions"][0]
    if only["dst_offset"] != 0 or only["dst_strides"] != c_strides(only["size"]):
        return None
    if math.prod(only["size"]) != math.prod(attrs["shape"]):
        return None
    return only


def _refine(reg: Region, inner_sizes: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Split the dims of ``reg`` (a read of a dense tensor of ``inner_sizes``) at that tensor's
    dim boundaries, so each piece walks within one of its dims: (sizes, src, dst strides)."""
    dense = c_strides(inner_sizes)
    sizes, src, dst = [], [], []
    for n, s, d in zip(reg["size"], reg["src_strides"], reg["dst_strides"], strict=True):
        pieces = []
        while s in dense and n > 1:
            radix = inner_sizes[dense.index(s)]
            if n <= radix or n % radix or radix == 1:
                break
            pieces.append((radix, s, d))
            n, s, d = n // radix, s * radix, d * radix
        pieces.append((n, s, d))
        for n_, s_, d_ in reversed(pieces):
            sizes.append(n_)
            src.append(s_)
            dst.append(d_)
    return sizes, src, dst


def _compose(outer: Region, inner: Region, index: int) -> Region | None:
    """``outer`` reads the output of a Raster whose dense region is ``inner``: the same copy
    straight from that Raster's input, when the composed index map is strided."""
    sizes, src, dst = _refine(outer, inner["size"])
    count = math.prod(sizes)
    if not sizes or not inner["size"] or count == 0 or count > MAX_MERGE_ELEMENTS:
        return None
    grids = np.indices(sizes, dtype=np.int64).reshape(len(sizes), -1)
    flat = outer["src_offset"] + np.asarray(src, np.int64) @ grids
    digits = np.unravel_index(flat, inner["size"])
    mapped = inner["src_offset"] + sum(
        (np.asarray(g, np.int64) * s for g, s in zip(digits, inner["src_strides"], strict=True)),
        start=np.zeros_like(flat),
    )
    start = int(mapped[0])
    strides = []
    for axis in range(len(sizes)):
        unit = [0] * len(sizes)
        unit[axis] = 1 if sizes[axis] > 1 else 0
        position = int(np.ravel_multi_index(unit, sizes))
        strides.append(int(mapped[position]) - start)
    expected = start + np.asarray(strides, np.int64) @ grids
    if not np.array_equal(mapped, expected):
        return None
    return region(index, start, strides, outer["dst_offset"], dst, sizes)


def merge_rasters(nodes: list[dict[str, Any]], outputs: set[str]) -> list[dict[str, Any]]:
    """Fold each Raster read only by one other Raster (and not a graph output) into it, when its
    copy is one dense strided read and the composition is strided again."""
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node["inputs"]:
            readers.setdefault(name, []).append(i)
    producer = {node["outputs"][0]: i for i, node in enumerate(nodes) if node["op"] == "Raster"}
    nodes = list(nodes)
    dropped: set[int] = set()
    for i in range(len(nodes)):
        if nodes[i]["op"] != "Raster":
            continue
        for name in list(dict.fromkeys(nodes[i]["inputs"])):
            j = producer.get(name)
            if j is None or j in dropped or name in outputs or set(readers.get(name, [])) != {i}:
                continue
            merged = _merge_one(nodes[i], nodes[j], name)
            if merged is None:
                continue
            nodes[i] = merged
            dropped.add(j)
            source = nodes[j]["inputs"][_single_dense(nodes[j])["input"]]
            readers[source] = [i if r == j else r for r in readers.get(source, [])]
    return [node for k, node in enumerate(nodes) if k not in dropped]


def _merge_one(node: dict[str, Any], first: dict[str, Any], name: str) -> dict[str, Any] | None:
    """``node`` with its reads of ``name`` (the output of the Raster ``first``) composed through."""
    inner = _single_dense(first)
    if inner is None:
        return None
    source = first["inputs"][inner["input"]]
    inputs = list(node["inputs"])
    if source not in inputs:
        inputs.append(source)
    target = inputs.index(source)
    reading = {k for k, n in enumerate(node["inputs"]) if n == name}
    regions = []
    for reg in node["attrs"]["regions"]:
        if reg["input"] in reading:
            try:
                reg = _compose(reg, inner, target)
            except (ValueError, IndexError):
                reg = None
            if reg is None:
                return None
        regions.append(dict(reg))
    used = sorted({reg["input"] for reg in regions})
    renumber = {old: new for new, old in enumerate(used)}
    for reg in regions:
        reg["input"] = renumber[reg["input"]]
    attrs = {**node["attrs"], "regions": regions}
    if "dtype" not in attrs and "dtype" in first["attrs"]:
        attrs["dtype"] = first["attrs"]["dtype"]
    return {**node, "inputs": [inputs[k] for k in used], "attrs": attrs}


def _is_identity(node: dict[str, Any], ctx: _Context) -> bool:
    """A Raster copying its one input whole, in order: a reshape."""
    if node["op"] != "Raster" or "fill" in node["attrs"] or len(node["inputs"]) != 1:
        return False
    regions, total = node["attrs"]["regions"], math.prod(node["attrs"]["shape"])
    source = ctx.shape(node["inputs"][0])
    if len(regions) != 1 or source is None or math.prod(source) != total:
        return False
    only = regions[0]
    full = only["size"] == [total] and only["src_strides"] == [1] and only["dst_strides"] == [1]
    return (full or total <= 1 and only["size"] == []) and only["src_offset"] == 0 and only["dst_offset"] == 0


def lower_data_movement(graph: FerryGraph, *, keep_views: bool = True) -> FerryGraph:
    """Static-shape data movement -> Raster nodes, chains of them merged into one.

    With ``keep_views`` (the default), a Raster that only reshapes (a whole, in-order copy)
    becomes a Reshape again, the original node when it is one: the engine runs that as a view,
    a Raster would copy."""
    ctx = _Context(graph)
    nodes: list[dict[str, Any]] = []
    original: dict[str, dict[str, Any]] = {}
    for node in graph.nodes:
        lowered = lower_node(node, ctx)
        if lowered is None:
            ctx.follow(node)
            nodes.append(node)
            continue
        if node["op"] in VIEWS:
            original[lowered[0]["outputs"][0]] = node
        nodes.extend(lowered)
    nodes = merge_rasters(nodes, {spec["name"] for spec in graph.outputs})
    tensors = graph.tensors
    if keep_views:
        tensors = dict(tensors)
        for k, node in enumerate(nodes):
            if not _is_identity(node, ctx):
                continue
            out = node["outputs"][0]
            before = original.get(out)
            if before is not None and before["inputs"][0] == node["inputs"][0]:
                nodes[k] = before
                continue
            shape_name = f"{node['name']}/shape"
            while shape_name in tensors:
                shape_name += "_"
            tensors[shape_name] = np.array(node["attrs"]["shape"], dtype=np.int64)
            nodes[k] = {
                "name": node["name"],
                "op": "Reshape",
                "inputs": [node["inputs"][0], shape_name],
                "outputs": [out],
                "attrs": {},
            }
    return FerryGraph(**{**graph.__dict__, "nodes": nodes, "tensors": tensors})
