"""Graph optimization: a list of small passes, each FerryGraph -> FerryGraph.

Every pass keeps the graph's inputs and outputs (names, meaning) exactly; tests run the
graph after each pass against onnxruntime on the original model.  Order matters only as
written in PASSES: folding first (it exposes constant weights), then pattern fusions (GELU,
LayerNorm, attention) before BatchNorm folding and bias/activation fusion (with a LayerNorm's
scale and bias folded into the MatMuls reading it, and a skip connection's Add into the Conv
before it), then static-shape data movement lowered to Raster nodes (converter/lower.py), the
head split and merge Rasters around attention folded into it as strided views (and its scale
into the q projection), rows nobody reads dropped from the last block of a classifier
(``narrow_rows``), and dead-node removal last.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from converter.lower import lower_data_movement, raster, region
from converter.translate import FerryGraph
from engine.ops import PREPARES, REGISTRY, kernel_for

Pass = Callable[[FerryGraph], FerryGraph]
PASS_THROUGH = {"Identity", "Dropout"}
# Constant folding never makes the package grow much: a folded result may be at most this
# many times the bytes of the tensors it replaces (plus a little), so e.g. a user's int8
# DequantizeLinear weights are not expanded back to float32.
FOLD_GROWTH, FOLD_SLACK_BYTES = 2, 4096
NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
FUSABLE_ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSwish", "Gelu", "LeakyRelu", "Tanh", "HardSigmoid")


def optimize(graph: FerryGraph) -> tuple[FerryGraph, list[dict[str, Any]]]:
    """Run every pass in order; return the graph and, per pass, the node count after it."""
    log = []
    for step in PASSES:
        graph = step(graph)
        log.append({"pass": step.__name__, "nodes": len(graph.nodes)})
    return graph, log


# --- helpers --------------------------------------------------------------------------------


def _replace(graph: FerryGraph, **changes: Any) -> FerryGraph:
    return FerryGraph(**{**graph.__dict__, **changes})


def _readers(graph: FerryGraph) -> dict[str, list[int]]:
    """Value name -> indices of the nodes reading it."""
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in node["inputs"]:
            if name:
                readers.setdefault(name, []).append(index)
    return readers


def _producers(graph: FerryGraph) -> dict[str, int]:
    return {name: index for index, node in enumerate(graph.nodes) for name in node["outputs"] if name}


def _graph_outputs(graph: FerryGraph) -> set[str]:
    return {spec["name"] for spec in graph.outputs}


def _only_reader(graph: FerryGraph, readers: dict[str, list[int]], value: str) -> int | None:
    """The single node reading ``value``, if exactly one does and it is not a graph output."""
    found = readers.get(value, [])
    if len(found) != 1 or value in _graph_outputs(graph):
        return None
    return found[0]


def _scalar(graph: FerryGraph, name: str) -> float | None:
    array = graph.tensors.get(name)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def _without(graph: FerryGraph, drop: set[int], changed: dict[int, dict[str, Any]]) -> FerryGraph:
    nodes = [changed.get(i, node) for i, node in enumerate(graph.nodes) if i not in drop]
    return _replace(graph, nodes=nodes)


# --- passes ---------------------------------------------------------------------------------


def drop_pass_through(graph: FerryGraph) -> FerryGraph:
    """Remove Identity (and inference-time Dropout) nodes whose output is not a graph output."""
    outputs = _graph_outputs(graph)
    read = {name for node in graph.nodes for name in node["inputs"]}
    alias: dict[str, str] = {}
    nodes = []
    for node in graph.nodes:
        node = {**node, "inputs": [alias.get(name, name) for name in node["inputs"]]}
        if _is_pass_through(node, outputs, read):
            alias[node["outputs"][0]] = node["inputs"][0]
            continue
        nodes.append(node)
    return _replace(graph, nodes=nodes)


def _is_pass_through(node: dict, outputs: set[str], read: set[str]) -> bool:
    if node["op"] not in PASS_THROUGH or node["outputs"][0] in outputs or not node["inputs"][0]:
        return False
    extra = [name for name in node["outputs"][1:] if name]  # Dropout's mask
    return not any(name in read or name in outputs for name in extra)


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


def fuse_gelu(graph: FerryGraph) -> FerryGraph:
    """x * 0.5 * (1 + erf(x / sqrt 2)) as PyTorch exports it (Div, Erf, Add, Mul, Mul) -> Gelu."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "Erf" or index in drop:
            continue
        match = _match_gelu(graph, readers, producers, index)
        if match is None:
            continue
        x, nodes, last = match
        drop.update(i for i in nodes if i != last)
        out = graph.nodes[last]["outputs"]
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "Gelu",
            "inputs": [x],
            "outputs": out,
            "attrs": {},
        }
    return _without(graph, drop, changed)


def _match_gelu(graph, readers, producers, erf_index):
    """(x, node indices, index of the last node) when the Erf sits in a GELU pattern."""
    erf = graph.nodes[erf_index]
    div_index = producers.get(erf["inputs"][0])
    if div_index is None:
        return None
    div = graph.nodes[div_index]
    x = div["inputs"][0]
    if div["op"] == "Div":
        ok = abs((_scalar(graph, div["inputs"][1]) or 0) - np.sqrt(2)) < 1e-3
    elif div["op"] == "Mul":
        ok = abs((_scalar(graph, div["inputs"][1]) or 0) - 1 / np.sqrt(2)) < 1e-3
    else:
        ok = False
    add_index = _only_reader(graph, readers, erf["outputs"][0])
    if not ok or add_index is None or _only_reader(graph, readers, div["outputs"][0]) != erf_index:
        return None
    add = graph.nodes[add_index]
    if add["op"] != "Add" or _scalar(graph, _other(add, erf["outputs"][0])) != 1.0:
        return None
    # then Mul by x and Mul by 0.5, in either order: (x * (1 + erf)) * 0.5 or x * ((1 + erf) * 0.5)
    first_index = _only_reader(graph, readers, add["outputs"][0])
    if first_index is None:
        return None
    first = graph.nodes[first_index]
    second_index = _only_reader(graph, readers, first["outputs"][0])
    if first["op"] != "Mul" or second_index is None or graph.nodes[second_index]["op"] != "Mul":
        return None
    second = graph.nodes[second_index]
    factors = {_other(first, add["outputs"][0]), _other(second, first["outputs"][0])}
    half = [f for f in factors if _scalar(graph, f) == 0.5]
    if len(half) != 1 or factors - set(half) != {x}:
        return None
    return x, [div_index, erf_index, add_index, first_index, second_index], second_index


def _other(node: dict[str, Any], value: str) -> str:
    """The other input of a two-input node, given one of them."""
    a, b = node["inputs"][:2]
    return b if a == value else a


def fuse_layer_norm(graph: FerryGraph) -> FerryGraph:
    """ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul scale, Add bias over the last
    axis (as PyTorch exports LayerNorm) -> LayerNormalization."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "ReduceMean" or index in drop:
            continue
        match = _match_layer_norm(graph, readers, producers, index)
        if match is None:
            continue
        x, scale, bias, eps, members, last = match
        drop.update(i for i in members if i != last)
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "LayerNormalization",
            "inputs": [x, scale, bias],
            "outputs": [graph.nodes[last]["outputs"][0]],
            "attrs": {"axis": -1, "epsilon": eps},
        }
    return _without(graph, drop, changed)


def _last_axis_mean(graph: FerryGraph, node: dict[str, Any]) -> bool:
    axes = node["attrs"].get("axes")
    if axes is None and len(node["inputs"]) > 1 and node["inputs"][1] in graph.tensors:
        axes = graph.tensors[node["inputs"][1]].reshape(-1).tolist()
    return axes == [-1] and int(node["attrs"].get("keepdims", 1)) == 1


def _match_layer_norm(graph, readers, producers, mean_index):
    mean = graph.nodes[mean_index]
    if not _last_axis_mean(graph, mean):
        return None
    x = mean["inputs"][0]
    sub_index = _only_reader(graph, readers, mean["outputs"][0])
    if (
        sub_index is None
        or graph.nodes[sub_index]["op"] != "Sub"
        or graph.nodes[sub_index]["inputs"]
        != [
            x,
            mean["outputs"][0],
        ]
    ):
        return None
    centered = graph.nodes[sub_index]["outputs"][0]
    users = readers.get(centered, [])
    if len(users) != 2 or centered in _graph_outputs(graph):
        return None
    pow_index = next((i for i in users if graph.nodes[i]["op"] == "Pow"), None)
    div_index = next((i for i in users if graph.nodes[i]["op"] == "Div"), None)
    if pow_index is None or div_index is None or _scalar(graph, graph.nodes[pow_index]["inputs"][1]) != 2.0:
        return None
    chain = [pow_index]
    for op in ("ReduceMean", "Add", "Sqrt"):
        following = _only_reader(graph, readers, graph.nodes[chain[-1]]["outputs"][0])
        if following is None or graph.nodes[following]["op"] != op:
            return None
        chain.append(following)
    var_mean, add_eps, sqrt = (graph.nodes[i] for i in chain[1:])
    eps = _scalar(graph, _other(add_eps, var_mean["outputs"][0]))
    div = graph.nodes[div_index]
    if not _last_axis_mean(graph, var_mean) or eps is None or div["inputs"] != [centered, sqrt["outputs"][0]]:
        return None
    mul_index = _only_reader(graph, readers, div["outputs"][0])
    mul = graph.nodes[mul_index] if mul_index is not None else None
    if mul is None or mul["op"] != "Mul" or _other(mul, div["outputs"][0]) not in graph.tensors:
        return None
    add_index = _only_reader(graph, readers, mul["outputs"][0])
    add = graph.nodes[add_index] if add_index is not None else None
    if add is None or add["op"] != "Add" or _other(add, mul["outputs"][0]) not in graph.tensors:
        return None
    scale, bias = _other(mul, div["outputs"][0]), _other(add, mul["outputs"][0])
    if graph.tensors[scale].ndim != 1 or graph.tensors[bias].ndim != 1:
        return None
    members = [mean_index, sub_index, *chain, div_index, mul_index, add_index]
    return x, scale, bias, eps, members, add_index


def fuse_attention(graph: FerryGraph) -> FerryGraph:
    """Scaled dot-product attention as exporters emit it -> one FusedAttention node:
    MatMul(q, Transpose(k) | kT) -> Mul/Div by a constant -> [Add mask] -> Softmax(-1) -> MatMul(., v)."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] != "Softmax" or index in drop:
            continue
        match = _match_attention(graph, readers, producers, index)
        if match is None:
            continue
        inputs, attrs, members, last = match
        drop.update(i for i in members if i != last)
        changed[last] = {
            "name": graph.nodes[last]["name"],
            "op": "FusedAttention",
            "inputs": inputs,
            "outputs": graph.nodes[last]["outputs"],
            "attrs": attrs,
        }
    return _without(graph, drop, changed)


def _match_attention(graph, readers, producers, softmax_index):
    softmax = graph.nodes[softmax_index]
    if int(softmax["attrs"].get("axis", -1)) != -1 or graph.opset < 13:
        return None
    members, mask = [softmax_index], None
    current = producers.get(softmax["inputs"][0])
    if current is not None and graph.nodes[current]["op"] == "Add":  # an additive mask
        add = graph.nodes[current]
        before = producers.get(add["inputs"][0])
        if before is None or _only_reader(graph, readers, add["outputs"][0]) != softmax_index:
            return None
        members.append(current)
        mask, current = add["inputs"][1], before
    if current is None or graph.nodes[current]["op"] not in ("Mul", "Div"):
        return None
    scaling = graph.nodes[current]
    factor = _scalar(graph, scaling["inputs"][1])
    if factor is None or factor == 0 or _only_reader(graph, readers, scaling["outputs"][0]) != members[-1]:
        return None
    scale = factor if scaling["op"] == "Mul" else 1.0 / factor
    members.append(current)
    scores_index = producers.get(scaling["inputs"][0])
    if scores_index is None or graph.nodes[scores_index]["op"] != "MatMul":
        return None
    if _only_reader(graph, readers, graph.nodes[scores_index]["outputs"][0]) != current:
        return None
    members.append(scores_index)
    q, k = graph.nodes[scores_index]["inputs"]
    attrs: dict[str, Any] = {"scale": scale, "k_transposed": 1}
    transpose_index = producers.get(k)
    if transpose_index is not None and _only_reader(graph, readers, k) == scores_index:
        transpose = graph.nodes[transpose_index]
        perm = transpose["attrs"].get("perm") or []
        swap_last_two = [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]
        if transpose["op"] == "Transpose" and len(perm) >= 2 and perm == swap_last_two:
            k, attrs["k_transposed"] = transpose["inputs"][0], 0
            members.append(transpose_index)
    out_index = _only_reader(graph, readers, softmax["outputs"][0])
    if out_index is None or graph.nodes[out_index]["op"] != "MatMul":
        return None
    output = graph.nodes[out_index]
    if output["inputs"][0] != softmax["outputs"][0]:
        return None
    members.append(out_index)
    inputs = [q, k, output["inputs"][1]] + ([mask] if mask else [])
    return inputs, attrs, members, out_index


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


FUSE_INTO = {"Conv": "FusedConv", "Gemm": "FusedGemm", "MatMul": "FusedMatMul", "FusedMatMul": "FusedMatMul"}


def fuse_activation(graph: FerryGraph) -> FerryGraph:
    """Conv / Gemm / MatMul followed by Relu, Clip (constant bounds), Sigmoid, HardSwish, Gelu...
    -> one Fused* node applying the activation to its own output."""
    readers = _readers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        if node["op"] not in FUSE_INTO or "activation" in node["attrs"]:
            continue
        act_index = _only_reader(graph, readers, node["outputs"][0])
        if act_index is None or graph.nodes[act_index]["op"] not in FUSABLE_ACTIVATIONS:
            continue
        act = graph.nodes[act_index]
        extra = _activation_attrs(graph, act)
        if extra is None:
            continue
        attrs = {**node["attrs"], "activation": act["op"], "activation_attrs": extra}
        changed[index] = {**node, "op": FUSE_INTO[node["op"]], "attrs": attrs, "outputs": act["outputs"]}
        drop.add(act_index)
    return _without(graph, drop, changed)


def fuse_residual_add(graph: FerryGraph) -> FerryGraph:
    """Add(Conv(x), r), then optionally an activation, with r of exactly the conv output's shape
    -> one FusedConv(x, W, B, r): the conv kernel adds r (in its own result's memory layout,
    see engine/ops/conv.py) and applies the activation, so ResNet's and MobileNetV2's skip
    connections need no Add and Relu nodes.  The node takes the conv's place, or the Add's when
    r is made later."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, add in enumerate(graph.nodes):
        match = _residual_conv(graph, readers, producers, index) if add["op"] == "Add" else None
        if match is None:
            continue
        conv_index, residual = match
        conv = graph.nodes[conv_index]
        activation, outputs = _then_activation(graph, readers, add, drop)
        bias = conv["inputs"][2] if len(conv["inputs"]) > 2 else ""
        fused = {
            **conv,
            "op": "FusedConv",
            "attrs": {**conv["attrs"], **activation},
            "inputs": [*conv["inputs"][:2], bias, residual],
            "outputs": outputs,
        }
        ready = producers.get(residual, -1) < conv_index
        changed[conv_index if ready else index] = fused
        drop.add(index if ready else conv_index)
    return _without(graph, drop, changed)


def _residual_conv(
    graph: FerryGraph, readers: dict[str, list[int]], producers: dict[str, int], index: int
) -> tuple[int, str] | None:
    """(index of the Conv, residual value) for the Add at ``index``: one operand made by a plain
    Conv that only this Add reads, the other a computed value of the very same known shape (no
    broadcasting).  With two such Convs, the later one, whose residual is ready where it runs."""
    add = graph.nodes[index]
    if len(add["inputs"]) != 2 or add["inputs"][0] == add["inputs"][1]:
        return None
    options = []
    for value, other in (add["inputs"], add["inputs"][::-1]):
        conv_index = producers.get(value)
        if conv_index is None or other in graph.tensors or _only_reader(graph, readers, value) != index:
            continue
        conv = graph.nodes[conv_index]
        shape = graph.shapes.get(value)
        if conv["op"] != "Conv" or len(conv["inputs"]) > 3 or not shape or len(shape) < 3:
            continue
        if None not in shape and shape == graph.shapes.get(other):
            options.append((conv_index, other))
    return max(options, default=None)


def _then_activation(
    graph: FerryGraph, readers: dict[str, list[int]], add: dict[str, Any], drop: set[int]
) -> tuple[dict[str, Any], list[str]]:
    """The activation attrs and the outputs of a FusedConv standing for ``add``: those of the
    fusable activation that alone reads the Add's output (it joins ``drop``), else none and the
    Add's outputs."""
    act_index = _only_reader(graph, readers, add["outputs"][0])
    act = graph.nodes[act_index] if act_index is not None else None
    if act is None or act["op"] not in FUSABLE_ACTIVATIONS:
        return {}, add["outputs"]
    extra = _activation_attrs(graph, act)
    if extra is None:
        return {}, add["outputs"]
    drop.add(act_index)
    return {"activation": act["op"], "activation_attrs": extra}, act["outputs"]


def _activation_attrs(graph: FerryGraph, act: dict[str, Any]) -> dict[str, Any] | None:
    if act["op"] != "Clip":
        return dict(act["attrs"])
    bounds = {}
    for key, position in (("min", 1), ("max", 2)):
        name = act["inputs"][position] if len(act["inputs"]) > position else ""
        if name:
            value = _scalar(graph, name)
            if value is None:
                return None  # bounds computed at run time
            bounds[key] = value
        elif key in act["attrs"]:
            bounds[key] = act["attrs"][key]
    return bounds


def simplify_transposes(graph: FerryGraph) -> FerryGraph:
    """Transpose(Transpose(x)) -> one Transpose, or nothing when the permutations cancel."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    alias: dict[str, str] = {}
    for index, node in enumerate(graph.nodes):
        first_index = producers.get(node["inputs"][0]) if node["op"] == "Transpose" else None
        if first_index is None or first_index in drop or first_index in changed:
            continue
        first = graph.nodes[first_index]
        if first["op"] != "Transpose" or _only_reader(graph, readers, first["outputs"][0]) != index:
            continue
        outer, inner = node["attrs"].get("perm"), first["attrs"].get("perm")
        if outer is None or inner is None or len(outer) != len(inner):
            continue
        perm = [inner[axis] for axis in outer]
        drop.add(first_index)
        if perm == sorted(perm) and node["outputs"][0] not in _graph_outputs(graph):
            drop.add(index)
            alias[node["outputs"][0]] = first["inputs"][0]
        else:
            changed[index] = {**node, "inputs": [first["inputs"][0]], "attrs": {"perm": perm}}
    out = _without(graph, drop, changed)
    if alias:
        nodes = [{**n, "inputs": [alias.get(v, v) for v in n["inputs"]]} for n in out.nodes]
        out = _replace(out, nodes=nodes)
    return out


def simplify_reshapes(graph: FerryGraph) -> FerryGraph:
    """Reshape(Reshape(x, s1), s2) -> Reshape(x, s2) when s2 is constant and has no 0 (copy) dims."""
    readers, producers = _readers(graph), _producers(graph)
    drop: set[int] = set()
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        first_index = producers.get(node["inputs"][0]) if node["op"] == "Reshape" else None
        if first_index is None or first_index in changed or first_index in drop:
            continue
        first = graph.nodes[first_index]
        shape = graph.tensors.get(node["inputs"][1])
        if first["op"] != "Reshape" or shape is None or 0 in shape.reshape(-1).tolist():
            continue
        if _only_reader(graph, readers, first["outputs"][0]) != index:
            continue
        drop.add(first_index)
        changed[index] = {**node, "inputs": [first["inputs"][0], node["inputs"][1]]}
    return _without(graph, drop, changed)


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


def fold_attention_scale(graph: FerryGraph) -> FerryGraph:
    """Fold an unmasked FusedAttention's scale (times log2(e), for the kernel's base-2 softmax)
    into the columns of the q projection's weights and bias, when q, k and v are views of one
    FusedMatMul's output and q's columns are read by nothing else: the kernel then uses q as it
    comes instead of making a scaled copy of it (attr ``q_log2e``)."""
    readers, producers = _readers(graph), _producers(graph)
    tensors = dict(graph.tensors)
    changed: dict[int, dict[str, Any]] = {}
    for index, node in enumerate(graph.nodes):
        views = node["attrs"].get("views") if node["op"] == "FusedAttention" else None
        if not views or len(node["inputs"]) != 3 or node["attrs"].get("q_log2e") or None in views:
            continue
        source = node["inputs"][0]
        projection_index = producers.get(source)
        columns = _q_columns(graph, node, readers, projection_index)
        if columns is None or projection_index in changed:
            continue
        projection = graph.nodes[projection_index]
        factor = float(node["attrs"].get("scale", 1.0)) * math.log2(math.e)
        weight_name, bias_name = projection["inputs"][1], projection["inputs"][2]
        weight, bias = tensors[weight_name].astype(np.float64), tensors[bias_name].astype(np.float64)
        weight[:, columns] *= factor
        bias[columns] *= factor
        names = [f"{weight_name}@q_scaled", f"{bias_name}@q_scaled"]
        tensors[names[0]] = weight.astype(tensors[weight_name].dtype)
        tensors[names[1]] = bias.astype(tensors[bias_name].dtype)
        changed[projection_index] = {**projection, "inputs": [projection["inputs"][0], *names]}
        changed[index] = {**node, "attrs": {**node["attrs"], "scale": 1.0, "q_log2e": 1}}
    return _replace(_without(graph, set(), changed), tensors=tensors)


def _q_columns(
    graph: FerryGraph, node: dict[str, Any], readers: dict[str, list[int]], projection_index: int | None
) -> np.ndarray | None:
    """The output columns of the attention's q projection that q reads, when that projection
    is a float FusedMatMul with its own constant weights and bias, read by this node alone (as
    q, k and v), and no column is read both as q and as k or v."""
    source = node["inputs"][0]
    alone = set(node["inputs"]) == {source} and len(set(readers[source])) == 1
    if projection_index is None or not alone or source in _graph_outputs(graph):
        return None
    projection = graph.nodes[projection_index]
    inputs = projection["inputs"]
    if projection["op"] != "FusedMatMul" or len(inputs) != 3 or projection["attrs"].get("activation"):
        return None
    weight, bias = graph.tensors.get(inputs[1]), graph.tensors.get(inputs[2])
    if weight is None or bias is None or weight.ndim != 2 or bias.shape != (weight.shape[1],):
        return None
    if weight.dtype.kind != "f" or any(len(readers.get(name, [])) != 1 for name in inputs[1:]):
        return None
    width = weight.shape[1]
    q, k, v = (set(_view_indices(view).reshape(-1) % width) for view in node["attrs"]["views"])
    if q & (k | v):
        return None
    return np.array(sorted(q), dtype=np.int64)


def _view_indices(view: dict[str, Any]) -> np.ndarray:
    """Every flat index a view {"shape", "offset", "strides"} reads."""
    index = np.full([int(d) for d in view["shape"]], int(view["offset"]), dtype=np.int64)
    for axis, (count, stride) in enumerate(zip(view["shape"], view["strides"], strict=True)):
        along = [-1 if other == axis else 1 for other in range(index.ndim)]
        index += np.arange(int(count), dtype=np.int64).reshape(along) * int(stride)
    return index


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


def drop_dead(graph: FerryGraph) -> FerryGraph:
    """Remove nodes nothing downstream of the outputs needs, and tensors no node reads."""
    needed = _graph_outputs(graph)
    kept = []
    for node in reversed(graph.nodes):
        if any(name in needed for name in node["outputs"]):
            kept.append(node)
            needed.update(name for name in node["inputs"] if name)
    kept.reverse()
    tensors = {name: array for name, array in graph.tensors.items() if name in needed}
    return _replace(graph, nodes=kept, tensors=tensors)


PASSES: list[Pass] = [
    drop_pass_through,
    fold_constants,
    simplify_transposes,
    simplify_reshapes,
    fuse_gelu,
    fuse_layer_norm,
    fuse_attention,
    fold_batch_norm,
    fuse_matmul_add,
    fold_layer_norm_affine,
    fuse_residual_add,  # before fuse_activation: it takes the activation after the Add itself
    fuse_activation,
    lower_data_movement,
    fold_attention_views,
    drop_dead,  # the readers the two passes below look at must be live ones
    fold_attention_scale,
    narrow_rows,
    drop_dead,
]
