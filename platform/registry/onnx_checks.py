"""What an uploaded .onnx must not do, checked at upload before anything is stored.

An upload is one file, so a tensor that keeps its data in an external file can only point at
something on the server: ``../../etc/passwd``, an absolute path, a symbolic link planted next to
the converter's copy (the CVE-2022-25882 / CVE-2024-27318 class of path tricks). Every tensor
of the model (initializers, sparse ones, node attributes, subgraphs, functions, training info)
must hold its data inline. The converter refuses the same again where it loads (converter/load.py).

The file is read as protobuf wire format, field by field, skipping tensor data with a seek: the
check never holds the model in memory (uploads go up to FERRY_MAX_UPLOAD_BYTES). A file that
does not read as ONNX at all is left to the conversion job, which reports it in its own words.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from registry.errors import InvalidUpload

_MAX_SHOWN = 120  # characters of a name or location quoted in a refusal
_MAX_DEPTH = 64  # nested subgraphs; deeper is not a model the converter would take either
_MAX_STRING = 4096  # bytes of a name or location read at all

# Field numbers of onnx.proto: message kind -> {field: kind of the submessage}.
_SCHEMA: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


class ExternalDataRefused(InvalidUpload):
    code = "external_data_refused"


class _Unreadable(Exception):
    """Not ONNX wire format: the conversion job reports it."""


def check_self_contained(stream: BinaryIO) -> None:
    """Refuse (ExternalDataRefused) a model whose tensors name external data; rewind the stream."""
    stream.seek(0, 2)
    end = stream.tell()
    stream.seek(0)
    try:
        _walk(stream, end, "model", "", 0)
    except _Unreadable:
        return
    finally:
        stream.seek(0)


def _walk(f: BinaryIO, end: int, kind: str, where: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise _Unreadable
    children = _SCHEMA[kind]
    names: dict[str, str] = {}
    for number, wire, value, start in _fields(f, end):
        if kind == "node" and number in (3, 4) and wire == 2 and not names.get("node"):  # name, op_type
            names["node"] = _string(f, start, value)
        elif kind == "attribute" and number == 1 and wire == 2:
            names["attribute"] = _string(f, start, value)
        if wire != 2 or number not in children:
            continue
        child = children[number]
        here = _where(kind, number, names, where)
        if child == "tensor":
            _tensor(f, start + value, here)
        else:
            _walk(f, start + value, child, here, depth + 1)


def _where(kind: str, number: int, names: dict[str, str], outer: str) -> str:
    if kind == "graph" and number == 5:
        return "initializer"
    if kind == "graph" and number == 15:
        return "sparse initializer"
    if kind == "node":
        return f"node {names.get('node', '?')!r}"
    if kind == "attribute":
        return f"{outer} attribute {names.get('attribute', '?')!r}"
    return outer


def _tensor(f: BinaryIO, end: int, where: str) -> None:
    name, location, external = "", None, False
    for number, wire, value, start in _fields(f, end):
        if number == 8 and wire == 2:
            name = _string(f, start, value)
        elif number == 13 and wire == 2:
            external = True
            key, text = _entry(f, start + value)
            if key == "location":
                location = text
        elif number == 14 and wire == 0 and value == _EXTERNAL:
            external = True
    if external:
        what = f"{where} {name!r}" if where in ("initializer", "sparse initializer") else where
        raise ExternalDataRefused(_refusal(what, location or ""))


def _entry(f: BinaryIO, end: int) -> tuple[str, str]:
    """A StringStringEntryProto: (key, value)."""
    key = value = ""
    for number, wire, length, start in _fields(f, end):
        if wire == 2 and number == 1:
            key = _string(f, start, length)
        elif wire == 2 and number == 2:
            value = _string(f, start, length)
    return key, value


def _fields(f: BinaryIO, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, varint value or length, start of a length-delimited value);
    after each, the reader is moved past the field whatever the consumer read of it."""
    while f.tell() < end:
        key = _varint(f, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Unreadable
        if wire == 0:
            yield number, wire, _varint(f, end), f.tell()
        elif wire in (1, 5):
            f.seek(8 if wire == 1 else 4, 1)
        elif wire == 2:
            length = _varint(f, end)
            start = f.tell()
            if start + length > end:
                raise _Unreadable
            yield number, wire, length, start
            f.seek(start + length)
        else:
            raise _Unreadable
    if f.tell() != end:
        raise _Unreadable


def _varint(f: BinaryIO, end: int) -> int:
    result = shift = 0
    while shift < 64:
        if f.tell() >= end:
            raise _Unreadable
        byte = f.read(1)
        if not byte:
            raise _Unreadable
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7
    raise _Unreadable


def _string(f: BinaryIO, start: int, length: int) -> str:
    f.seek(start)
    text = f.read(min(length, _MAX_STRING)).decode("utf-8", errors="replace")
    f.seek(start + length)
    return text[:_MAX_SHOWN]


def _refusal(where: str, location: str) -> str:
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
