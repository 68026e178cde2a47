"""Weight storage precision: fp16, int8 (symmetric, per output channel) and int4 (asymmetric,
block-wise along the reduction axis, two values per byte).

Only weights change; the engine computes in float32.  What each quantized weight becomes:

- MatMul / Gemm with a constant 2-D weight -> one ``QMatMul`` node (engine/ops/quantized.py),
  which casts a few MB of the weight's rows at a time into a reused float buffer and, per
  output channel, scales the product rather than the weight.  Gemm's B is stored as [K, N]
  (transposed at conversion when transB=1), and its constant bias becomes QMatMul's bias.
- Conv -> ``DequantizeLinear`` feeding the Conv (int4: of the weight flattened to
  [out, in*kh*kw], then a Reshape back; a 1x1 kernel's blocks lie along its own axis 1, so it
  is dequantized as it is).
- Gather on axis 0 of a constant table (embeddings) -> ``QGather``, which dequantizes only the
  rows it gathers.

Any other reader of a weight (or a weight read in two different ways) keeps it float32.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from converter.translate import FerryGraph

QUANTIZE_MODES = (None, "fp16", "int8", "int4")
BLOCK_SIZES = (32, 64, 128)
FP16_MAX = float(np.finfo(np.float16).max)
MIN_ELEMENTS = 64  # smaller weights save nothing worth the error


def to_fp16(graph: FerryGraph) -> tuple[FerryGraph, list[str]]:
    """Store float32 tensors as float16; the engine casts them back to float32 at load.

    Tensors with values beyond float16's range stay float32 (their names are returned).
    """
    tensors = dict(graph.tensors)
    casts = dict(graph.load_casts)
    kept = []
    for name, array in sorted(graph.tensors.items()):
        if array.dtype != np.float32 or array.size == 0:
            continue
        finite = array[np.isfinite(array)]
        if finite.size and float(np.abs(finite).max()) > FP16_MAX:
            kept.append(name)
            continue
        tensors[name] = array.astype(np.float16)
        casts[name] = "float32"
    return FerryGraph(**{**graph.__dict__, "tensors": tensors, "load_casts": casts}), kept


# --- the arithmetic -------------------------------------------------------------------------


def quantize_int8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per channel along ``axis``: (q int8 in [-127, 127], scale float32 [channels])."""
    others = tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.max(np.abs(weight), axis=others) if others else np.abs(weight)
    scale = (amax / 127.0).astype(np.float32)
    scale[scale == 0] = 1.0  # an all-zero channel: any scale gives zeros
    shape = [1] * weight.ndim
    shape[axis] = -1
    q = np.clip(np.rint(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def quantize_int4(weight: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric uint4 blocks of ``block`` along axis 0 of a 2-D [K, N] weight.

    Returns (q uint8 [K, N] in 0..15, scale [ceil(K/block), N], zero point uint8 same shape).
    Each block's range includes 0 so that its zero point is a representable integer.  The
    scale is float16 (rounded before the values are quantized with it, so they agree) unless
    some block's is outside float16's normal range; then float32.
    """
    k, n = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = weight
    grouped = padded.reshape(blocks, block, n)
    low = np.minimum(grouped.min(axis=1), 0.0)
    high = np.maximum(grouped.max(axis=1), 0.0)
    span = high - low
    exact = np.where(span == 0, 1.0, span / 15.0).astype(np.float32)
    # float16 halves the scales' size, but below its smallest normal number it loses precision
    # (tiny weights) and above its max it overflows: then this tensor keeps float32 scales
    fits = exact.min() >= np.finfo(np.float16).tiny and exact.max() <= FP16_MAX
    scale = exact.astype(np.float16) if fits else exact
    scale32 = scale.astype(np.float32)
    zero = np.clip(np.rint(-low / scale32), 0, 15).astype(np.uint8)
    q = np.clip(np.rint(grouped / scale32[:, None, :]) + zero[:, None, :], 0, 15).astype(np.uint8)
    return q.reshape(blocks * block, n)[:k], scale, zero


def pack4(values: np.ndarray) -> np.ndarray:
    """Values 0..15 (or -8..7 as int8) two per byte, low nibble first, as a flat uint8 array."""
    flat = (values.reshape(-1).astype(np.int16) & 0x0F).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def dequantized(
    q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, axis: int, block: int
) -> np.ndarray:
    """The float weight a quantized one stands for (for error estimates)."""
    values = q.astype(np.float32)
    if block:
        expand = lambda p: np.repeat(p.astype(np.float32), block, axis=axis).take(  # noqa: E731
            np.arange(q.shape[axis]), axis=axis
        )
    else:
        shape = [1] * q.ndim
        shape[axis] = -1
        expand = lambda p: p.astype(np.float32).reshape(shape)  # noqa: E731
    if zero is not None:
        values -= expand(zero)
    return values * expand(scale)


# --- where the weights are ------------------------------------------------------------------


@dataclass(frozen=True)
class WeightUse:
    """A quantizable weight read by ``node`` (its index in graph.nodes) in the way ``kind`` says."""

    node: int
    kind: str  # "matmul", "gemm", "conv", "gather"
    tensor: str


def quantizable(graph: FerryGraph) -> list[WeightUse]:
    """Weights that can be quantized: float32 constants of at least MIN_ELEMENTS values whose
    every reader is one of the forms above (a weight read any other way stays float32)."""
    uses: dict[str, list[WeightUse]] = {}
    readers: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for name in node["inputs"]:
            readers[name] = readers.get(name, 0) + 1
        use = _use(graph, index, node)
        if use is not None:
            uses.setdefault(use.tensor, []).append(use)
    outputs = {spec["name"] for spec in graph.outputs}
    return [
        found[0]
        for name, found in sorted(uses.items(), key=lambda item: item[1][0].node)
        if len(found) == 1 and readers[name] == 1 and name not in outputs
    ]


def _use(graph: FerryGraph, index: int, node: dict[str, Any]) -> WeightUse | None:
    op, inputs, attrs = _BASE_OP.get(node["op"], node["op"]), node["inputs"], node["attrs"]
    slot = 0 if op == "Gather" else 1
    if op not in ("MatMul", "Gemm", "Conv", "Gather") or len(inputs) <= slot:
        return None
    weight = graph.tensors.get(inputs[slot])
    if weight is None or weight.dtype != np.float32 or weight.size < MIN_ELEMENTS:
        return None
    if inputs[0] in graph.tensors and op != "Gather":
        return None  # both operands constant: constant folding's business
    if op == "MatMul" and weight.ndim == 2:
        return WeightUse(index, "matmul", inputs[1])
    if op == "Gemm" and _plain_gemm(graph, inputs, attrs):
        return WeightUse(index, "gemm", inputs[1])
    if op == "Conv" and weight.ndim >= 3:
        return WeightUse(index, "conv", inputs[1])
    if op == "Gather" and weight.ndim == 2 and int(attrs.get("axis", 0)) in (0, -2):
        return WeightUse(index, "gather", inputs[0])
    return None


_BASE_OP = {"FusedMatMul": "MatMul", "FusedGemm": "Gemm", "FusedConv": "Conv"}


def _plain_gemm(graph: FerryGraph, inputs: list[str], attrs: dict[str, Any]) -> bool:
    """A Gemm QMatMul can stand for: no transA, alpha = beta = 1, bias absent or a constant vector."""
    if (
        attrs.get("transA", 0)
        or float(attrs.get("alpha", 1.0)) != 1.0
        or float(attrs.get("beta", 1.0)) != 1.0
    ):
        return False
    if len(inputs) > 2 and inputs[2]:
        bias = graph.tensors.get(inputs[2])
        return bias is not None and bias.ndim <= 1
    return True


# --- rewriting the graph --------------------------------------------------------------------


@dataclass
class QuantizedWeight:
    node: str
    tensor: str
    kind: str
    shape: list[int]
    relative_error: float  # ||w - dequantized(q)|| / ||w||


def quantize_weights(
    graph: FerryGraph, mode: str, block_size: int, keep: frozenset[str] = frozenset()
) -> tuple[FerryGraph, list[QuantizedWeight]]:
    """Quantize every quantizable weight whose node is not named in ``keep``."""
    nodes = [dict(node) for node in graph.nodes]
    tensors, casts = dict(graph.tensors), dict(graph.load_casts)
    before: dict[int, list[dict[str, Any]]] = {}
    done = []
    steps: dict[str, float] = {}  # bias -> its layer's smallest weight step (_narrow_floats)
    readers = Counter(name for node in graph.nodes for name in node["inputs"])
    for use in quantizable(graph):
        node = nodes[use.node]
        if node["name"] in keep:
            continue
        bias = _bias_of(graph, node, use.kind, readers)
        rewrite = _REWRITES[use.kind]
        inserted, error = rewrite(node, tensors, casts, mode, block_size)
        before[use.node] = inserted
        done.append(
            QuantizedWeight(node["name"], use.tensor, use.kind, list(graph.tensors[use.tensor].shape), error)
        )
        del tensors[use.tensor]
        if bias:
            steps[bias] = float(tensors[f"{use.tensor}/scale"].astype(np.float32).min())
    ordered = []
    for index, node in enumerate(nodes):
        ordered.extend(before.get(index, []))
        ordered.append(node)
    kept = {name for node in graph.nodes if node["name"] in keep for name in node["inputs"]}
    _narrow_floats(tensors, casts, kept | {spec["name"] for spec in graph.outputs}, steps)
    return FerryGraph(**{**graph.__dict__, "nodes": ordered, "tensors": tensors, "load_casts": casts}), done


# The float32 tensors quantizing leaves (biases, LayerNorm weights, position embeddings added as
# constants, the int8 scales) were 4-6 % of an int8 package: stored as float16 (cast back to
# float32 at load) where that moves them by at most this much, relative (int8 weights move by
# ~0.5 %), they take half that.
NARROW_MAX_ERROR = 1e-3


def _narrow_floats(
    tensors: dict[str, np.ndarray],
    casts: dict[str, str],
    keep: set[str],
    steps: dict[str, float] | None = None,
) -> None:
    """Every float32 tensor of at least MIN_ELEMENTS not in ``keep`` (read by a layer kept
    float32, or an output) stored as float16 when its relative error stays within
    NARROW_MAX_ERROR (so not beyond float16's range, nor mostly below its normal numbers), or,
    for the bias of a quantized layer (``steps``: bias name -> the smallest quantization step of
    its weight), when it moves no value by more than NARROW_MAX_ERROR of that step."""
    steps = steps or {}
    for name, array in sorted(tensors.items()):
        if array.dtype != np.float32 or array.size < MIN_ELEMENTS or name in keep or name in casts:
            continue
        if not np.all(np.isfinite(array)) or float(np.abs(array).max(initial=0)) > FP16_MAX:
            continue
        half = array.astype(np.float16)
        back = half.astype(np.float32)
        # a bias of ~1e-8 (BatchNorm folded into a conv of MobileNetV2) is below float16's
        # normal numbers, so its relative error is large, yet it moves the layer's output far
        # less than one step of the layer's quantized weights already does
        negligible = name in steps and float(np.abs(array - back).max()) <= NARROW_MAX_ERROR * steps[name]
        if negligible or _relative(array, back) <= NARROW_MAX_ERROR:
            tensors[name], casts[name] = half, "float32"


def _bias_of(graph: FerryGraph, node: dict[str, Any], kind: str, readers: Counter) -> str:
    """The constant bias a quantized Conv or Gemm adds (read by no other node), or ""."""
    inputs = node["inputs"]
    if kind not in ("conv", "gemm") or len(inputs) < 3 or inputs[2] not in graph.tensors:
        return ""
    return inputs[2] if readers[inputs[2]] == 1 else ""


def _store(tensors: dict[str, np.ndarray], casts: dict[str, str], prefix: str, q, scale, zero) -> list[str]:
    """Add the quantized tensors under ``prefix`` and return [q, scale, zero point or ""]."""
    names = [f"{prefix}/q", f"{prefix}/scale", f"{prefix}/zero" if zero is not None else ""]
    tensors[names[0]] = q
    tensors[names[1]] = scale
    if scale.dtype == np.float16:
        casts[names[1]] = "float32"  # stored half size; the engine computes with float32 scales
    if zero is not None:
        tensors[names[2]] = zero
    return names


def _quantized_2d(weight: np.ndarray, mode: str, block: int, reduce_axis: int):
    """(q, scale, zero, attrs, relative error) for a 2-D weight whose reduction axis is given."""
    if mode == "int8":
        axis = 1 - reduce_axis
        q, scale = quantize_int8(weight, axis)
        error = _relative(weight, dequantized(q, scale, None, axis, 0))
        return q, scale, None, {"axis": axis}, error
    work = weight if reduce_axis == 0 else weight.T
    q, scale, zero = quantize_int4(np.ascontiguousarray(work), block)
    error = _relative(work, dequantized(q, scale, zero, 0, block))
    if reduce_axis == 1:
        q, scale, zero = q.T, np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T)
    attrs = {"axis": reduce_axis, "block_size": block, "packed": "uint4", "shape": list(weight.shape)}
    return pack4(np.ascontiguousarray(q)), scale, pack4(zero), attrs, error


def _relative(weight: np.ndarray, approx: np.ndarray) -> float:
    norm = float(np.linalg.norm(weight))
    return float(np.linalg.norm(weight - approx) / norm) if norm else 0.0


def _rewrite_matmul(node, tensors, casts, mode, block):
    """MatMul(A, W) / Gemm(A, W, c) -> QMatMul(A, q, scale, zero, bias) with W as [K, N]."""
    inputs, attrs = node["inputs"], node["attrs"]
    weight = tensors[inputs[1]]
    if node["op"] in ("Gemm", "FusedGemm") and attrs.get("transB", 0):
        weight = weight.T
    q, scale, zero, qattrs, error = _quantized_2d(np.ascontiguousarray(weight), mode, block, 0)
    names = _store(tensors, casts, inputs[1], q, scale, zero)
    bias = inputs[2] if len(inputs) > 2 else ""
    activation = {k: attrs[k] for k in ("activation", "activation_attrs") if k in attrs}
    node.update(op="QMatMul", inputs=[inputs[0], *names, bias], attrs={**qattrs, **activation})
    while node["inputs"] and not node["inputs"][-1]:
        node["inputs"].pop()
    return [], error


def _rewrite_conv(node, tensors, casts, mode, block):
    """Conv(X, W, ...) -> DequantizeLinear(q...) -> [Reshape] -> Conv.

    In int4 mode a kernel whose every output channel has fewer weights than one block (a
    depthwise 3x3 has 9) is stored int8 per channel instead: a 4-bit range per 9 weights costs
    much accuracy and saves next to nothing.
    """
    weight_name = node["inputs"][1]
    weight = tensors[weight_name]
    out = f"{weight_name}/dequantized"
    if mode == "int8" or weight[0].size < block:
        q, scale = quantize_int8(weight, 0)
        error = _relative(weight, dequantized(q, scale, None, 0, 0))
        names = _store(tensors, casts, weight_name, q, scale, None)
        nodes = [_node(f"{node['name']}/dequantize", "DequantizeLinear", names[:2], [out], {"axis": 0})]
    elif all(k == 1 for k in weight.shape[2:]):
        # a 1x1 kernel's blocks run along its input channels, axis 1 of the 4-D weight itself:
        # scales shaped (M, blocks, 1, 1) dequantize it in place, with no Reshape node (nor
        # shape tensor) after, ~300 bytes of graph and weights a layer
        q, scale, zero, qattrs, error = _quantized_2d(weight.reshape(weight.shape[:2]), mode, block, 1)
        scale = scale.reshape(*scale.shape, *weight.shape[2:])
        names = _store(tensors, casts, weight_name, q, scale, zero)
        qattrs = {**qattrs, "shape": list(weight.shape)}
        nodes = [_node(f"{node['name']}/dequantize", "DequantizeLinear", names, [out], qattrs)]
    else:
        flat = weight.reshape(weight.shape[0], -1)
        q, scale, zero, qattrs, error = _quantized_2d(flat, mode, block, 1)
        names = _store(tensors, casts, weight_name, q, scale, zero)
        shape_name = f"{weight_name}/shape"
        tensors[shape_name] = np.array(weight.shape, np.int64)
        nodes = [
            _node(f"{node['name']}/dequantize", "DequantizeLinear", names, [out + "/2d"], qattrs),
            _node(f"{node['name']}/reshape", "Reshape", [out + "/2d", shape_name], [out], {}),
        ]
    node["inputs"] = [node["inputs"][0], out, *node["inputs"][2:]]
    return nodes, error


def _rewrite_gather(node, tensors, casts, mode, block):
    """Gather(T, idx) on axis 0 -> QGather(q, scale, zero, idx): rows dequantized as gathered."""
    table_name, indices = node["inputs"][0], node["inputs"][1]
    # a row is one embedding: per-row scales (int8) or blocks along the row (int4)
    q, scale, zero, qattrs, error = _quantized_2d(tensors[table_name], mode, block, 1)
    names = _store(tensors, casts, table_name, q, scale, zero)
    node.update(op="QGather", inputs=[*names, indices], attrs=qattrs)
    return [], error


def _node(name: str, op: str, inputs: list[str], outputs: list[str], attrs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "op": op, "inputs": inputs, "outputs": outputs, "attrs": attrs}


_REWRITES = {
    "matmul": _rewrite_matmul,
    "gemm": _rewrite_matmul,
    "conv": _rewrite_conv,
    "gather": _rewrite_gather,
}
