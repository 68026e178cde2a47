"""Validation: only models the engine can run, in an opset it understands, get through.

Order matters for the messages: operator support is checked before the ONNX checker,
because the checker rejects custom domains with a less useful message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, version_converter

from converter.errors import InvalidModelError, UnsupportedOperatorsError, printable
from converter.limits import Limits
from engine import unsupported_nodes

MIN_OPSET = 11  # older models are upgraded to this with onnx.version_converter
MAX_OPSET = onnx.defs.onnx_opset_version()  # the newest the pinned onnx knows
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
    if versions[0] > MAX_OPSET:
        raise InvalidModelError(
            f"{label}: opset {versions[0]} is newer than {MAX_OPSET}, the newest this converter's onnx knows"
        )
    return int(versions[0])


def check_structure(model: onnx.ModelProto, label: str) -> None:
    """Every node reads only values defined before it: name the cycle, misordering or dangling input.

    The ONNX checker reports all three as "not topologically sorted"; these messages say which.
    """
    graph = model.graph
    names = node_names(graph)
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    for index, node in enumerate(graph.node):
        for value in node.input:
            if value in defined:
                continue
            if value not in producer:
                op = printable(node.op_type)
                raise InvalidModelError(
                    f"{label}: node {names[index]!r} ({op}) reads {value!r}, which no graph "
                    "input, initializer or node produces"
                )
            cycle = _cycle_through(graph, producer, index)
            if cycle:
                path = " -> ".join(repr(names[i]) for i in cycle)
                raise InvalidModelError(f"{label}: the graph has a cycle: {path}")
            raise InvalidModelError(
                f"{label}: nodes are not topologically sorted: node {names[index]!r} reads {value!r}, "
                f"which the later node {names[producer[value]]!r} produces"
            )
        defined.update(node.output)
    missing = [v.name for v in graph.output if v.name not in defined]
    if missing:
        raise InvalidModelError(f"{label}: graph outputs {missing} are never produced")


def _cycle_through(graph: onnx.GraphProto, producer: dict[str, int], start: int) -> list[int]:
    """Node indices of a dependency cycle that returns to ``start``, or [] if there is none."""
    stack, seen = [(start, [start])], set()
    while stack:
        index, path = stack.pop()
        for value in graph.node[index].input:
            upstream = producer.get(value)
            if upstream is None:
                continue
            if upstream == start:
                return [start, *reversed(path[1:]), start]
            if upstream not in seen:
                seen.add(upstream)
                stack.append((upstream, [*path, upstream]))
    return []


def check_initializers(model: onnx.ModelProto, label: str, limits: Limits) -> None:
    """Each initializer's data has exactly the bytes its dims and type need, within the size limit."""
    for tensor in model.graph.initializer:
        if any(d < 0 for d in tensor.dims):
            dims = list(tensor.dims)
            raise InvalidModelError(f"{label}: initializer {tensor.name!r} has negative dims {dims}")
        count = int(np.prod(tensor.dims, dtype=np.float64))
        _check_tensor_bytes(label, f"initializer {tensor.name!r}", tensor.data_type, count, limits)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        have = _stored_elements(tensor)
        if have is not None and have != count:
            raise InvalidModelError(
                f"{label}: initializer {tensor.name!r} holds {have} value(s) but its shape "
                f"{list(tensor.dims)} needs {count}"
            )


def _stored_elements(tensor: onnx.TensorProto) -> int | None:
    """How many values the tensor's data holds (None when the type's storage is not simple)."""
    if tensor.HasField("raw_data"):
        if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            return None
        bits = _element_bits(tensor.data_type)
        if bits is None:
            return None
        total = len(tensor.raw_data) * 8
        return total // bits if bits >= 8 else None  # 4-bit types pad to whole bytes
    field = helper.tensor_dtype_to_field(tensor.data_type) if tensor.data_type else None
    if field is None:
        return None
    values = len(getattr(tensor, field))
    if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        values //= 2
    return values


def _element_bits(data_type: int) -> int | None:
    if data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return 4
    try:
        return int(helper.tensor_dtype_to_np_dtype(data_type).itemsize * 8)
    except (KeyError, TypeError, ValueError):
        return None


def _check_tensor_bytes(label: str, what: str, data_type: int, count: float, limits: Limits) -> None:
    bits = _element_bits(data_type) or 32
    size = count * bits / 8
    if size > limits.max_tensor_bytes:
        raise InvalidModelError(
            f"{label}: {what} would be {size:,.0f} bytes, over the {limits.max_tensor_bytes:,}-byte "
            "tensor limit (FERRY_CONVERTER_MAX_TENSOR_BYTES)"
        )


def check_value_sizes(model: onnx.ModelProto, label: str, limits: Limits) -> None:
    """After shape inference: no value whose shape is known (fully or in its fixed dims) is too large."""
    graph = model.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
            continue
        fixed = [d.dim_value for d in tensor_type.shape.dim if d.HasField("dim_value")]
        count = float(np.prod(fixed, dtype=np.float64)) if fixed else 1.0
        what = f"tensor {value.name!r} (fixed dims {fixed})"
        _check_tensor_bytes(label, what, tensor_type.elem_type, count, limits)


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


def check_and_infer(model: onnx.ModelProto, label: str, path: Path | None = None) -> onnx.ModelProto:
    """onnx.checker (full) then strict shape inference; return the model with inferred shapes.

    ``path``: the large-model route, whose ``model`` holds no weight data (it stays in external
    files next to ``path``).  The checker then reads the file at ``path`` itself (so it resolves
    the external files against the model's own directory, and nothing is serialized whole), and
    shape inference (strict, types checked) runs on the weightless ``model``, which is small.
    After an opset upgrade the checker has seen the source at its own opset, and the upgraded
    graph gets that strict shape inference only (checking it in memory would look for its
    external files relative to the working directory)."""
    try:
        if path is None:
            onnx.checker.check_model(model, full_check=True)
        else:
            onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InvalidModelError(f"{label}: the model fails the ONNX checker: {_one_line(exc)}") from exc
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise InvalidModelError(f"{label}: shape inference failed: {_one_line(exc)}") from exc


def _one_line(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
