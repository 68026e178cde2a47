"""Post-training static int8 activations: ranges observed on the user's calibration samples,
written as standard QuantizeLinear -> DequantizeLinear pairs (the QDQ form) on the activation
input of every quantized MatMul/Gemm/Conv.

An int8-capable runtime fuses each pair with the int8 weights into an integer kernel; Ferry's
numpy engine runs the pair as written, so on it this simulates int8 activations (the accuracy
report shows their cost) rather than speeding anything up.

Ranges per tensor, asymmetric uint8: ``minmax`` takes the smallest and largest value seen;
``percentile`` the 0.01th and 99.99th percentiles, so a few outliers do not stretch the scale.

``dynamic`` needs no calibration: the same inputs get DynamicQuantizeLinear -> DequantizeLinear
(onnxruntime's quantize_dynamic form), so each run quantizes with its own values' range.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from converter.translate import FerryGraph

METHODS = ("minmax", "percentile")  # static: ranges from calibration samples
DYNAMIC = "dynamic"  # ranges from each run's own values
MODES = (*METHODS, DYNAMIC)
PERCENTILE = 99.99
QUANTIZED_READERS = {"QMatMul": 0, "Conv": 0, "FusedConv": 0}
Runner = Callable[[FerryGraph, list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]


def activation_inputs(graph: FerryGraph) -> list[str]:
    """Values read as the activation of a quantized MatMul/Gemm or an ungrouped Conv with
    quantized weights.  A grouped (depthwise) conv's input stays float: no integer kernel takes
    it, and a quantize/dequantize pair there only costs accuracy and two passes (MobileNetV2 with
    them: 0.74x its float32 time, cosine 0.979 to float32)."""
    dequantized = {out for node in graph.nodes if node["op"] == "DequantizeLinear" for out in node["outputs"]}
    reshaped = {
        n["outputs"][0] for n in graph.nodes if n["op"] == "Reshape" and n["inputs"][0] in dequantized
    }
    found = []
    for node in graph.nodes:
        slot = QUANTIZED_READERS.get(node["op"])
        if slot is None or node["op"] != "QMatMul" and node["inputs"][1] not in dequantized | reshaped:
            continue
        if int(node["attrs"].get("group", 1)) != 1:
            continue
        value = node["inputs"][slot]
        if value not in graph.tensors and value not in found:
            found.append(value)
    return found


def observe(
    graph: FerryGraph, values: list[str], feeds, run: Runner, method: str
) -> dict[str, tuple[float, float]]:
    """Each value's range on the calibration feeds, by ``method``."""
    known = {spec["name"] for spec in graph.outputs}
    extra = [{"name": v, "dtype": "float32", "shape": None} for v in values if v not in known]
    observer = FerryGraph(**{**graph.__dict__, "outputs": [*graph.outputs, *extra]})
    seen: dict[str, list[np.ndarray]] = {v: [] for v in values}
    for result in run(observer, feeds):
        for value in values:
            seen[value].append(np.asarray(result[value], dtype=np.float32).reshape(-1))
    ranges = {}
    for value, arrays in seen.items():
        data = np.concatenate(arrays)
        if method == "percentile":
            low, high = np.percentile(data, [100 - PERCENTILE, PERCENTILE])
        else:
            low, high = data.min(), data.max()
        ranges[value] = (float(min(low, 0.0)), float(max(high, 0.0)))
    return ranges


def insert_qdq(graph: FerryGraph, ranges: dict[str, tuple[float, float]]) -> FerryGraph:
    """QuantizeLinear -> DequantizeLinear (uint8, per tensor) on each value, right after it is
    produced; its readers among the quantized nodes read the dequantized copy."""
    tensors = dict(graph.tensors)
    pairs: dict[str, list[dict[str, Any]]] = {}
    for value, (low, high) in sorted(ranges.items()):
        scale = np.float32((high - low) / 255.0 or 1.0)
        zero = np.uint8(np.clip(np.rint(-low / scale), 0, 255))
        tensors[f"{value}/act_scale"], tensors[f"{value}/act_zero"] = np.array(scale), np.array(zero)
        quantized, dequantized = f"{value}/act_q", f"{value}/act_dq"
        params = [f"{value}/act_scale", f"{value}/act_zero"]
        pairs[value] = [
            _node(f"{value}/quantize", "QuantizeLinear", [value, *params], [quantized]),
            _node(f"{value}/dequantize", "DequantizeLinear", [quantized, *params], [dequantized]),
        ]
    return _rewired(FerryGraph(**{**graph.__dict__, "tensors": tensors}), pairs)


def insert_dynamic(graph: FerryGraph, values: list[str]) -> FerryGraph:
    """DynamicQuantizeLinear -> DequantizeLinear on each value (scale and zero point computed
    per run), placed and read like insert_qdq's pairs."""
    pairs = {}
    for value in values:
        quantized, dequantized = f"{value}/act_q", f"{value}/act_dq"
        params = [f"{value}/act_scale", f"{value}/act_zero"]
        pairs[value] = [
            _node(f"{value}/quantize", "DynamicQuantizeLinear", [value], [quantized, *params]),
            _node(f"{value}/dequantize", "DequantizeLinear", [quantized, *params], [dequantized]),
        ]
    return _rewired(graph, pairs)


def _rewired(graph: FerryGraph, pairs: dict[str, list[dict[str, Any]]]) -> FerryGraph:
    """``pairs[value]`` inserted right after ``value`` is produced (first, for a graph input),
    and the quantized nodes reading ``value`` reading its dequantized copy instead."""
    renamed = {value: f"{value}/act_dq" for value in pairs}
    nodes: list[dict[str, Any]] = []
    inputs = {spec["name"] for spec in graph.inputs}
    for value in pairs:
        if value in inputs:
            nodes.extend(pairs[value])
    for node in graph.nodes:
        if node["op"] in QUANTIZED_READERS:
            slot = QUANTIZED_READERS[node["op"]]
            reads = list(node["inputs"])
            reads[slot] = renamed.get(reads[slot], reads[slot])
            node = {**node, "inputs": reads}
        nodes.append(node)
        for output in node["outputs"]:
            nodes.extend(pairs.get(output, []))
    return FerryGraph(**{**graph.__dict__, "nodes": nodes})


def _node(name: str, op: str, inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    return {"name": name, "op": op, "inputs": inputs, "outputs": outputs, "attrs": {}}
