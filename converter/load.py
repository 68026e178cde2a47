"""Reading the source model: a path to an .onnx file, or a ModelProto already in memory."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import load_external_data_for_model, uses_external_data

from converter.errors import InvalidModelError

Source = str | os.PathLike[str] | onnx.ModelProto


@dataclass
class LoadedModel:
    model: onnx.ModelProto  # a private copy: later steps may modify it
    sha256: str
    size: int
    label: str  # for messages: the path, or "<ModelProto>"


def load_model(src: Source) -> LoadedModel:
    if isinstance(src, onnx.ModelProto):
        data = src.SerializeToString(deterministic=True)
        model = onnx.ModelProto()
        model.CopyFrom(src)
        label, base = "<ModelProto>", None
    else:
        path = Path(src)
        data = _read(path)
        model = _parse(data, str(path))
        label, base = str(path), path.parent
    _check_is_model(model, label)
    _load_external_data(model, base, label)
    return LoadedModel(model=model, sha256=hashlib.sha256(data).hexdigest(), size=len(data), label=label)


def _read(path: Path) -> bytes:
    if not path.exists():
        raise InvalidModelError(f"{path}: no such file")
    if not path.is_file():
        raise InvalidModelError(f"{path}: not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidModelError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if not data:
        raise InvalidModelError(f"{path}: the file is empty, not an ONNX model")
    return data


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidModelError(
            f"{label}: not an ONNX model (the file is not a valid ONNX protobuf)"
        ) from exc
    return model


def _check_is_model(model: onnx.ModelProto, label: str) -> None:
    """Protobuf parses many byte strings; an ONNX model at least has a graph, nodes and an opset."""
    if not model.HasField("graph") or not model.opset_import or not model.graph.node:
        raise InvalidModelError(f"{label}: not an ONNX model (no graph, nodes or opset import)")


def _load_external_data(model: onnx.ModelProto, base: Path | None, label: str) -> None:
    if not any(uses_external_data(t) for t in model.graph.initializer):
        return
    if base is None:
        raise InvalidModelError(f"{label}: weights are in external files; pass the .onnx path instead")
    try:
        load_external_data_for_model(model, str(base))
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{label}: cannot load external weight data ({exc})") from exc
