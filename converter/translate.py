"""ONNX protobuf -> the engine's graph: JSON-friendly nodes, numpy tensors, input/output specs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from converter.errors import ConversionError, InvalidModelError
from converter.load import external_array
from converter.validate import DEFAULT_DOMAINS, node_names

# dtypes the engine can hold in a tensor (numpy-native, fixed size).
TENSOR_DTYPES = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
}  # fmt: skip


@dataclass
class FerryGraph:
    """The package contents before writing: what becomes the engine's model files
    (engine.format.model_files) and the manifest's inputs, outputs and metadata."""

    nodes: list[dict[str, Any]]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    tensors: dict[str, np.ndarray]
    opset: int
    load_casts: dict[str, str] = field(default_factory=dict)
    # inferred shapes of intermediate values (dims as ints or symbolic names); not written out
    shapes: dict[str, list[int | str] | None] = field(default_factory=dict)

    def graph_dict(self) -> dict[str, Any]:
        graph = {
            "nodes": self.nodes,
            "inputs": [spec["name"] for spec in self.inputs],
            "outputs": [spec["name"] for spec in self.outputs],
            "opset": self.opset,
        }
        if self.load_casts:
            graph["load_casts"] = dict(sorted(self.load_casts.items()))
        return graph


def translate(model: onnx.ModelProto, opset: int, external_dir: Path | None = None) -> FerryGraph:
    """``external_dir``: where the initializers' external data still lies (the large-model route);
    those tensors become memory maps of it rather than copies."""
    graph = model.graph
    if graph.sparse_initializer:
        raise ConversionError("sparse initializers are not supported")
    tensors = {init.name: _initializer(init, external_dir) for init in graph.initializer}
    nodes = []
    for node, name in zip(graph.node, node_names(graph), strict=True):
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            tensors[node.output[0]] = _constant(node, name)
        else:
            nodes.append(node_dict(node, name))
    inputs = [_spec(v, required=True) for v in graph.input if v.name not in tensors]
    outputs = [_spec(v, required=False) for v in graph.output]
    shapes = {v.name: _shape(v) for v in [*graph.input, *graph.value_info, *graph.output]}
    return FerryGraph(
        nodes=nodes, inputs=inputs, outputs=outputs, tensors=tensors, opset=opset, shapes=shapes
    )


def _shape(value: onnx.ValueInfoProto) -> list[int | str] | None:
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
        return None
    return [
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim
    ]


def _initializer(proto: onnx.TensorProto, external_dir: Path | None) -> np.ndarray:
    if external_dir is None or not uses_external_data(proto):
        return _tensor(proto)
    _check_type(proto)
    type_name = onnx.TensorProto.DataType.Name(proto.data_type)
    if helper.tensor_dtype_to_np_dtype(proto.data_type).name not in TENSOR_DTYPES:
        raise ConversionError(f"tensor {proto.name!r} has type {type_name}, which the engine cannot hold")
    return external_array(proto, external_dir, "the model")


def _check_type(proto: onnx.TensorProto) -> None:
    if proto.data_type not in helper.get_all_tensor_dtypes() or proto.data_type == onnx.TensorProto.STRING:
        raise ConversionError(f"tensor {proto.name!r} has an unsupported data type")


def _tensor(proto: onnx.TensorProto) -> np.ndarray:
    _check_type(proto)
    array = numpy_helper.to_array(proto)
    if array.dtype.name not in TENSOR_DTYPES:
        type_name = onnx.TensorProto.DataType.Name(proto.data_type)
        raise ConversionError(f"tensor {proto.name!r} has type {type_name}, which the engine cannot hold")
    return array


def _constant(node: onnx.NodeProto, name: str) -> np.ndarray:
    """A Constant node's value as a tensor (the engine has no Constant op)."""
    attr = node.attribute[0] if len(node.attribute) == 1 else None
    if attr is None:
        raise InvalidModelError(f"Constant node {name!r} must have exactly one value attribute")
    if attr.name == "value":
        return _tensor(attr.t)
    simple = {
        "value_float": (attr.f, np.float32),
        "value_floats": (list(attr.floats), np.float32),
        "value_int": (attr.i, np.int64),
        "value_ints": (list(attr.ints), np.int64),
    }
    if attr.name not in simple:
        raise ConversionError(f"Constant node {name!r}: attribute {attr.name} is not supported")
    value, dtype = simple[attr.name]
    return np.array(value, dtype=dtype)


def node_dict(node: onnx.NodeProto, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "op": node.op_type,
        "inputs": list(node.input),
        "outputs": list(node.output),
        "attrs": {attr.name: attribute(attr, name) for attr in node.attribute},
    }


def json_float(value: float) -> float | str:
    """JSON has no NaN/Infinity: those travel as the strings the engine's tensor_attr decodes."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def tensor_json(array: np.ndarray) -> dict[str, Any]:
    data = array.reshape(-1).tolist()
    if array.dtype.kind == "f":
        data = [json_float(v) for v in data]
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": data}


def attribute(attr: AttributeProto, node: str) -> Any:
    kind = attr.type
    if kind == AttributeProto.FLOAT:
        return json_float(attr.f)
    if kind == AttributeProto.INT:
        return int(attr.i)
    if kind == AttributeProto.STRING:
        return attr.s.decode("utf-8")
    if kind == AttributeProto.TENSOR:
        return tensor_json(_tensor(attr.t))
    if kind == AttributeProto.FLOATS:
        return [json_float(v) for v in attr.floats]
    if kind == AttributeProto.INTS:
        return [int(v) for v in attr.ints]
    if kind == AttributeProto.STRINGS:
        return [s.decode("utf-8") for s in attr.strings]
    if kind == AttributeProto.TENSORS:
        return [tensor_json(_tensor(t)) for t in attr.tensors]
    kind_name = AttributeProto.AttributeType.Name(kind)
    raise ConversionError(f"node {node!r}: attribute {attr.name} of type {kind_name} is not supported")


def _spec(value: onnx.ValueInfoProto, *, required: bool) -> dict[str, Any]:
    """{"name", "dtype", "shape"}; unnamed dynamic dims get a unique name, unknown rank is None."""
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type") or tensor_type.elem_type == 0:
        raise InvalidModelError(f"graph input/output {value.name!r} is not a typed tensor")
    dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    if dtype.name not in TENSOR_DTYPES:
        raise ConversionError(
            f"graph input/output {value.name!r} has dtype {dtype}, which the engine cannot hold"
        )
    if not tensor_type.HasField("shape"):
        if required:
            raise InvalidModelError(
                f"graph input {value.name!r} has no shape (the engine needs at least its rank)"
            )
        return {"name": value.name, "dtype": dtype.name, "shape": None}
    shape: list[int | str] = []
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            shape.append(int(dim.dim_value))
        else:
            shape.append(dim.dim_param or f"{value.name}:{axis}")
    return {"name": value.name, "dtype": dtype.name, "shape": shape}
