"""What an uploaded .onnx must not do, checked at upload before anything is stored.

An upload is one file, so a tensor that keeps its data in an external file can only point at
something on the server: ``../../etc/passwd``, an absolute path, a symbolic link planted next to
the converter's copy (the CVE-2022-25882 / CVE-2024-27318 class of path tricks). Every tensor
of the model (initializers, sparse ones, node attributes, subgraphs, functions, training info)
must hold its data inline. The converter refuses the same again where it loads (converter/load.py).

A file that does not parse as ONNX at all is left to the conversion job, which reports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError

from registry.errors import InvalidUpload

# How a refused location is described: never the server's paths, only what the file says.
_MAX_SHOWN = 120


class ExternalDataRefused(InvalidUpload):
    code = "external_data_refused"


def check_self_contained(stream: BinaryIO) -> None:
    """Refuse (ExternalDataRefused) a model whose tensors name external data; rewind the stream."""
    stream.seek(0)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(stream.read())
    except (DecodeError, ValueError, RuntimeError):
        return  # not ONNX: the conversion job says so, in its own words
    finally:
        stream.seek(0)
    for where, tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            raise ExternalDataRefused(_refusal(where, tensor))


def _refusal(where: str, tensor: onnx.TensorProto) -> str:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    shown = repr(location[:_MAX_SHOWN])
    if location.startswith(("/", "\\")) or location[1:3] in (":/", ":\\"):
        why = f"an absolute path, {shown}"
    elif ".." in location.replace("\\", "/").split("/"):
        why = f"a path leaving the model's directory, {shown}"
    elif location:
        why = f"a file beside it, {shown}"
    else:
        why = "no file named"
    return (
        f"{where} keeps its data in an external file ({why}); an upload is one file, so external "
        "data could only name files on the server and is refused. Save the model with its weights "
        "inside: onnx.save(model, path, save_as_external_data=False)."
    )


def _tensors(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)
    for info in model.training_info:
        yield from _graph_tensors(info.initialization)
        yield from _graph_tensors(info.algorithm)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for tensor in graph.initializer:
        yield f"initializer {tensor.name[:_MAX_SHOWN]!r}", tensor
    for sparse in graph.sparse_initializer:
        yield f"sparse initializer {sparse.values.name[:_MAX_SHOWN]!r}", sparse.values
        yield f"sparse initializer {sparse.values.name[:_MAX_SHOWN]!r}", sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[tuple[str, onnx.TensorProto]]:
    for node in nodes:
        where = f"node {(node.name or node.op_type)[:_MAX_SHOWN]!r}"
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield f"{where} attribute {attribute.name!r}", attribute.t
            for tensor in attribute.tensors:
                yield f"{where} attribute {attribute.name!r}", tensor
            single = [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
            for sparse in [*single, *attribute.sparse_tensors]:
                yield f"{where} attribute {attribute.name!r}", sparse.values
                yield f"{where} attribute {attribute.name!r}", sparse.indices
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for graph in attribute.graphs:
                yield from _graph_tensors(graph)
