"""Reading the source model: a path to an .onnx file, or a ModelProto already in memory."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from onnx import helper
from onnx.external_data_helper import load_external_data_for_model, uses_external_data

from converter.errors import InvalidModelError
from converter.limits import Limits

Source = str | os.PathLike[str] | onnx.ModelProto


@dataclass
class LoadedModel:
    model: onnx.ModelProto  # a private copy: later steps may modify it
    sha256: str
    size: int
    label: str  # for messages: the path, or "<ModelProto>"
    # the large-model route (Limits.large_model_bytes): the .onnx file, its weights left in the
    # external files next to it (read by external_array), and the model checked through this path
    path: Path | None = None

    @property
    def external_dir(self) -> Path | None:
        return self.path.parent if self.path is not None else None


def load_model(src: Source, limits: Limits | None = None) -> LoadedModel:
    limits = limits or Limits()
    if isinstance(src, onnx.ModelProto):
        _check_in_memory_size(src, limits)
        data = src.SerializeToString(deterministic=True)
        model = onnx.ModelProto()
        model.CopyFrom(src)
        label, base = "<ModelProto>", None
    else:
        path = Path(src)
        data = _read(path, limits)
        model = _parse(data, str(path))
        label, base = str(path), path.parent
    _check_is_model(model, label)
    _check_text(model, label)
    large = _load_external_data(model, base, label, limits, len(data))
    return LoadedModel(
        model=model,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        label=label,
        path=Path(src) if large else None,
    )


def _check_in_memory_size(model: onnx.ModelProto, limits: Limits) -> None:
    """A ModelProto is hashed and copied whole, which protobuf cannot do past 2 GB: a model that
    large must come as a path with its weights in external files (the large-model route)."""
    size = model.ByteSize()
    _check_model_size(size, "<ModelProto>", limits)
    if size > limits.large_model_bytes:
        raise InvalidModelError(
            f"<ModelProto>: the model is {size:,} bytes, too large to convert from memory (over "
            f"{limits.large_model_bytes:,}, FERRY_CONVERTER_LARGE_MODEL_BYTES); save it with its weights "
            "in external data (onnx.save_model(..., save_as_external_data=True)) and pass the .onnx path"
        )


def _check_model_size(size: int, label: str, limits: Limits) -> None:
    if size > limits.max_model_bytes:
        raise InvalidModelError(
            f"{label}: the model is {size:,} bytes, over the {limits.max_model_bytes:,}-byte limit "
            "(FERRY_CONVERTER_MAX_MODEL_BYTES)"
        )


def _read(path: Path, limits: Limits) -> bytes:
    if not path.exists():
        raise InvalidModelError(f"{path}: no such file")
    if not path.is_file():
        raise InvalidModelError(f"{path}: not a file")
    _check_model_size(path.stat().st_size, str(path), limits)  # before reading it into memory
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


def _check_text(message: Message, label: str, path: str = "model") -> None:
    """Every string field is valid UTF-8 text.  Protobuf hands undecodable ones back as bytes,
    on which the ONNX checker and everything after it would fail in their own ways."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}"
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if _repeated(field) else [value]
            for index, item in enumerate(items):
                _check_text(item, label, f"{where}[{index}]" if _repeated(field) else where)
        elif field.type == FieldDescriptor.TYPE_STRING:
            for item in value if _repeated(field) else [value]:
                if not isinstance(item, str):
                    raise InvalidModelError(f"{label}: {where} is not valid UTF-8 text (a corrupted model?)")


def _repeated(field: FieldDescriptor) -> bool:
    return (
        field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED
    )


def _load_external_data(
    model: onnx.ModelProto, base: Path | None, label: str, limits: Limits, model_size: int
) -> bool:
    """Load external weights into the model, or (past ``large_model_bytes``) only check them
    and leave them on disk; return whether they were left there."""
    external = [t for t in model.graph.initializer if uses_external_data(t)]
    if not external:
        return False
    if base is None:
        raise InvalidModelError(f"{label}: weights are in external files; pass the .onnx path instead")
    files: dict[Path, int] = {}
    for tensor in external:
        path = _external_path(tensor, base, label)
        files[path] = path.stat().st_size
    total = model_size + sum(files.values())
    _check_model_size(total, label, limits)
    if total > limits.large_model_bytes:
        for tensor in external:
            _external_span(tensor, base, label)  # every range inside its file, before any work
        return True
    try:
        load_external_data_for_model(model, str(base))
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{label}: cannot load external weight data ({exc})") from exc
    return False


def external_array(tensor: onnx.TensorProto, base: Path, label: str) -> np.ndarray:
    """A tensor whose data stays in its external file, as a copy-on-write memory map of it: no
    copy in memory (pages come from the page cache as they are read), and a pass that writes
    into it changes only this process's copy, never the source file."""
    path, offset, length = _external_span(tensor, base, label)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if count * dtype.itemsize != length:
        raise InvalidModelError(
            f"{label}: tensor {tensor.name!r} has {length:,} bytes of external data but its shape "
            f"{list(tensor.dims)} needs {count * dtype.itemsize:,}"
        )
    if count == 0:
        return np.zeros(tuple(tensor.dims), dtype=dtype.newbyteorder("<"))
    array = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="c", offset=offset, shape=(count,))
    return array.reshape(tuple(tensor.dims))


def _external_span(tensor: onnx.TensorProto, base: Path, label: str) -> tuple[Path, int, int]:
    """(file, offset, length) of a tensor's external data, refused unless it lies inside the file."""
    path = _external_path(tensor, base, label)
    entries = {entry.key: entry.value for entry in tensor.external_data}
    size = path.stat().st_size
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else size - offset
    except ValueError as exc:
        raise InvalidModelError(f"{label}: tensor {tensor.name!r}: bad external data offset/length") from exc
    if offset < 0 or length < 0 or offset + length > size:
        raise InvalidModelError(
            f"{label}: tensor {tensor.name!r} has external data at bytes {offset:,}+{length:,}, "
            f"past the end of its {size:,}-byte file"
        )
    return path, offset, length


def _external_path(tensor: onnx.TensorProto, base: Path, label: str) -> Path:
    """The file holding a tensor's external data, refused unless it is a regular file inside the
    model's own directory: an uploaded model must not make the converter read anything else."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    where = f"{label}: tensor {tensor.name!r} has external data at {location!r}"
    if not location:
        raise InvalidModelError(f"{where}: no location given")
    relative = Path(location)
    if relative.is_absolute() or location.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", location):
        raise InvalidModelError(f"{where}: an absolute path; external data must sit next to the model")
    if ".." in relative.parts or ".." in location.replace("\\", "/").split("/"):
        raise InvalidModelError(f"{where}: the path leaves the model's directory ('..')")
    path = base / relative
    current = base
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            raise InvalidModelError(f"{where}: {part!r} is a symbolic link, which is not allowed")
    if not path.is_file():
        raise InvalidModelError(f"{where}: no such file next to the model")
    if not path.resolve().is_relative_to(base.resolve()):
        raise InvalidModelError(f"{where}: the path leaves the model's directory")
    return path
