"""Validation: only models the engine can run, in an opset it understands, get through.

Order matters for the messages: operator support is checked before the ONNX checker,
because the checker rejects custom domains with a less useful message.
"""

from __future__ import annotations

import onnx
from onnx import version_converter

from converter.errors import InvalidModelError, UnsupportedOperatorsError
from engine import unsupported_nodes

MIN_OPSET = 11  # older models are upgraded to this with onnx.version_converter
DEFAULT_DOMAINS = ("", "ai.onnx")
FOLDED = {"Constant"}  # turned into tensors by translate(); the engine never sees them


def node_names(graph: onnx.GraphProto) -> list[str]:
    """Stable, unique node names: the node's own, else op_type + index; repeats get the index appended."""
    seen: set[str] = set()
    names = []
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if name in seen:
            name = f"{name}_{index}"
        seen.add(name)
        names.append(name)
    return names


def default_opset(model: onnx.ModelProto, label: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise InvalidModelError(f"{label}: the model imports no version of the default ONNX domain")
    return int(versions[0])


def check_operators(model: onnx.ModelProto, supported: set[str]) -> None:
    """Raise UnsupportedOperatorsError naming every op (and custom domain) the engine lacks."""
    bad: dict[str, list[str]] = {}
    for node, name in zip(model.graph.node, node_names(model.graph), strict=True):
        if node.domain not in DEFAULT_DOMAINS:
            key = f"{node.domain}::{node.op_type} (custom domain)"
        elif node.op_type not in supported and node.op_type not in FOLDED:
            key = node.op_type
        else:
            continue
        bad.setdefault(key, []).append(name)
    if bad:
        raise UnsupportedOperatorsError(bad)


def check_engine_support(nodes: list[dict], opset: int) -> None:
    """Attribute values and outputs the engine lacks (e.g. Cast to bfloat16), after translation."""
    problems = unsupported_nodes(nodes, opset)
    if problems:
        grouped: dict[str, list[str]] = {}
        for name, reason in problems.items():
            grouped.setdefault(reason, []).append(name)
        raise UnsupportedOperatorsError(grouped)


def upgrade_opset(model: onnx.ModelProto, opset: int, label: str) -> onnx.ModelProto:
    if opset >= MIN_OPSET:
        return model
    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # noqa: BLE001 - the converter raises assorted C++ and Python errors
        raise InvalidModelError(
            f"{label}: opset {opset} is older than {MIN_OPSET} and could not be upgraded ({_one_line(exc)})"
        ) from exc


def check_and_infer(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """onnx.checker (full) then strict shape inference; return the model with inferred shapes."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InvalidModelError(f"{label}: the model fails the ONNX checker: {_one_line(exc)}") from exc
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise InvalidModelError(f"{label}: shape inference failed: {_one_line(exc)}") from exc


def _one_line(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
