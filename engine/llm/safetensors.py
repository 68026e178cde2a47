"""Reading *.safetensors with numpy, memory-mapped (no torch, no copy until a tensor is used).

The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor's
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that
follows the header; an optional ``__metadata__`` entry), then the raw little-endian data.
Every entry is checked against the file's size before any tensor is handed out, so a
truncated shard is refused naming the tensor that runs past its end.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

from engine.llm.errors import CheckpointError

DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 on read (numpy has no bfloat16)
    "F64": np.dtype("<f8"),
}
MAX_HEADER = 100 << 20  # the format's own limit on the JSON header


def read_header(path: str | Path) -> tuple[dict[str, dict], int]:
    """The tensor entries of one file and where its data begins."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as raw:
            head = raw.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path.name}: truncated (no 8-byte header length)")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path.name}: header length {length} runs past the file ({size} bytes)"
                )
            header = json.loads(raw.read(length))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path.name}: the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: the header must be a JSON object")
    header.pop("__metadata__", None)
    start = 8 + length
    for name, entry in header.items():
        _check_entry(path.name, name, entry, size - start)
    return header, start


def _check_entry(file: str, name: str, entry: object, data_size: int) -> None:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{file}: tensor {name!r} has no entry object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        raise CheckpointError(f"{file}: tensor {name!r} has dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{file}: tensor {name!r} has a malformed shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise CheckpointError(f"{file}: tensor {name!r} has malformed data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise CheckpointError(f"{file}: tensor {name!r} has data_offsets {offsets} out of order")
    if end > data_size:
        raise CheckpointError(f"{file}: tensor {name!r} runs past the end of the file (truncated?)")
    if end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
        raise CheckpointError(
            f"{file}: tensor {name!r} has {end - begin} bytes, its shape {shape} needs more/less"
        )


class SafetensorsFile:
    """One mapped file: ``names()``, ``shape(name)`` and ``tensor(name)`` (a read-only view, or a
    float32 copy for BF16)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.header, start = read_header(self.path)
        size = self.path.stat().st_size - start
        self._data = (
            np.memmap(self.path, dtype=np.uint8, mode="r", offset=start, shape=(size,)) if size else None
        )

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def tensor(self, name: str) -> np.ndarray:
        entry = self.header[name]
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        raw = self._data[begin:end] if self._data is not None else np.empty(0, np.uint8)
        values = raw.view(dtype).reshape(entry["shape"])
        if entry["dtype"] == "BF16":
            return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return values
