"""The engine's model files: what it loads, and how it lays out its weights.

A model is three files: ``manifest.json`` (format version, inputs and outputs, metadata such as
the self-test vectors, and the files with their sha256 and size), ``graph.json`` (nodes in
topological order, graph inputs/outputs, and a table of tensors giving each one's dtype, shape
and byte offset in the weights file) and ``weights.bin`` (the raw little-endian tensors, each
starting on a 64-byte boundary, memory-mapped).

The package container around them (the tar archive, its deterministic writing, the signature,
verification and safe unpacking) belongs to ``deploy/package``.  The engine loads an unpacked
directory, which the package library verified while unpacking it, so nothing is hashed again
there.  It also maps the files in place from a ``.ferry`` archive (uncompressed: the standard
library's tarfile says where each member starts) for tools and tests, and then checks them
against the manifest's sha256s, since nothing verified that archive before.

Format versions: v1, the first; v2 (2026-11) lets graph.json carry what a v1 engine would
silently ignore and so compute wrong results with: FusedAttention's ``views``, ``out_view``
and ``q_log2e``, and FusedConv's fourth input (a residual added before the activation).
The converter writes the newest version; the engine reads every version up to its own, so
packages already on devices keep loading after an engine update, and refuses newer ones
with a message saying to update.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from engine.errors import PackageError, PackageIntegrityError

FORMAT = "ferry-package"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
GRAPH = "graph.json"
WEIGHTS = "weights.bin"
ALIGNMENT = 64
HASH_CHUNK = 1 << 20  # bytes read at a time when verifying a file's sha256


@dataclass
class Package:
    """A loaded package: its manifest, its graph and its tensors (read-only, memory-mapped)."""

    manifest: dict[str, Any]
    graph: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    weights: np.ndarray | None = None  # the mapped weights file every tensor is a view of


def release_pages(blob: np.ndarray | None) -> None:
    """Drop a mapped file's pages from this process's resident set (Linux MADV_DONTNEED).

    The data stays valid: the next read faults the page back in from the page cache.  Used
    after planning (weights replaced by a pre-packed copy are then never touched again), so
    peak RSS counts only the weights a run reads.
    """
    handle = getattr(blob, "_mmap", None)  # numpy.memmap keeps its mmap object here
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if handle is None or advice is None or not hasattr(handle, "madvise"):
        return
    with contextlib.suppress(OSError, ValueError):  # only a resident-memory hint
        handle.madvise(advice)


def canonical_json(value: Any) -> bytes:
    """JSON bytes that are the same for the same value (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def write_tensors(tensors: dict[str, np.ndarray], out: IO[bytes]) -> dict[str, dict[str, Any]]:
    """Write tensors to ``out`` one after another, each 64-byte aligned; return their table.

    One tensor's bytes are in flight at a time, so a model of several GB (offsets are plain
    integers: weights.bin has no 2 or 4 GiB limit) needs no second copy of its weights."""
    table: dict[str, dict[str, Any]] = {}
    position = 0
    for name in sorted(tensors):
        # not np.ascontiguousarray: it turns 0-d tensors (scalar Gather indices...) into 1-d
        array = np.asarray(tensors[name], order="C")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        pad = (-position) % ALIGNMENT
        out.write(b"\0" * pad)
        position += pad
        table[name] = {
            "dtype": array.dtype.name,
            "shape": list(array.shape),
            "offset": position,
            "nbytes": int(array.nbytes),
        }
        out.write(memoryview(array.reshape(-1)).cast("B") if array.size else b"")
        position += int(array.nbytes)
    return table


def pack_tensors(tensors: dict[str, np.ndarray]) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """Lay tensors out in one buffer, each 64-byte aligned; return the buffer and its table."""
    buf = io.BytesIO()
    table = write_tensors(tensors, buf)
    return buf.getvalue(), table


def model_files(*, graph: dict[str, Any], tensors: dict[str, np.ndarray]) -> list[tuple[str, bytes]]:
    """graph.json and weights.bin for a graph and its tensors, as (name, bytes) in manifest order.

    ``graph`` holds ``nodes`` (each ``{"name", "op", "inputs", "outputs", "attrs"}``),
    ``inputs`` and ``outputs`` (lists of value names); its ``tensors`` table is filled in here.
    The package library (deploy.package.write_package) puts them in a package.
    """
    weights, table = pack_tensors(tensors)
    return [(GRAPH, canonical_json({**graph, "tensors": table})), (WEIGHTS, weights)]


def write_model_files(
    directory: str | os.PathLike[str], *, graph: dict[str, Any], tensors: dict[str, np.ndarray]
) -> list[tuple[str, Path]]:
    """``model_files`` written as files into ``directory`` (the weights streamed, never whole
    in memory), as (name, path) in manifest order."""
    directory = Path(directory)
    with open(directory / WEIGHTS, "wb") as out:
        table = write_tensors(tensors, out)
    (directory / GRAPH).write_bytes(canonical_json({**graph, "tensors": table}))
    return [(GRAPH, directory / GRAPH), (WEIGHTS, directory / WEIGHTS)]


def _open_files(path: Path) -> dict[str, tuple[Path, int, int]]:
    """Map file name -> (file, offset, size) for an unpacked directory, or an archive's members
    read in place (the engine only locates them; deploy/package owns the container)."""
    if path.is_dir():
        return {p.name: (p, 0, p.stat().st_size) for p in path.iterdir() if p.is_file()}
    try:
        with tarfile.open(path, mode="r:") as tar:
            return {m.name: (path, m.offset_data, m.size) for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError) as exc:
        raise PackageError(f"{path}: not a Ferry package archive ({exc})") from exc


def _map(location: tuple[Path, int, int]) -> np.ndarray:
    file, offset, size = location
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(file, dtype=np.uint8, mode="r", offset=offset, shape=(size,))


def _sha256(location: tuple[Path, int, int]) -> str:
    """The sha256 of a member, read through one small buffer.  Hashing the memory-mapped file
    instead would make every page of it resident at once: the peak RSS of a load would count
    the whole package, when a run only ever needs the weights it reads."""
    file, offset, size = location
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(max(1, min(size, HASH_CHUNK))))
    with open(file, "rb", buffering=0) as handle:
        handle.seek(offset)
        remaining = size
        while remaining:
            got = handle.readinto(buffer[: min(remaining, len(buffer))])
            if not got:
                break  # shorter than its tar header says: the digest cannot match
            digest.update(buffer[:got])
            remaining -= got
    return digest.hexdigest()


def _check_version(path: Path, manifest: dict[str, Any]) -> None:
    kind, version = manifest.get("format"), manifest.get("format_version")
    if kind != FORMAT:
        raise PackageError(f"{path}: format {kind!r} is not a {FORMAT!r}")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise PackageError(
            f"{path}: package format v{version} is newer than this engine reads "
            f"(v{READABLE_VERSIONS[0]}-v{FORMAT_VERSION}); update the engine (the agent) to run it"
        )
    if version not in READABLE_VERSIONS:
        raise PackageError(f"{path}: unknown {FORMAT!r} version {version!r}")


def read_package(path: str | os.PathLike[str], *, verify: bool | None = None) -> Package:
    """Load a package file or directory; raise PackageError / PackageIntegrityError if it is bad.

    ``verify`` (default: archives yes, directories no) checks every listed file against the
    manifest's sha256.  A directory is an unpacked package: deploy/package hashed each of its
    bytes while unpacking it, and hashing them again at every load would only cost time.
    """
    path = Path(path)
    if not path.exists():
        raise PackageError(f"{path}: no such package")
    if verify is None:
        verify = not path.is_dir()
    files = _open_files(path)
    if MANIFEST not in files:
        raise PackageError(f"{path}: has no {MANIFEST}")
    try:
        manifest = json.loads(bytes(_map(files[MANIFEST])))
    except ValueError as exc:
        raise PackageError(f"{path}: {MANIFEST} is not valid JSON ({exc})") from exc
    _check_version(path, manifest)
    blobs: dict[str, np.ndarray] = {}
    for entry in manifest.get("files", []):
        name = entry["path"]
        if name not in files:
            raise PackageIntegrityError(f"{path}: manifest lists {name} but the package has no such file")
        blob = _map(files[name])
        if verify:
            if blob.size != entry["size"]:
                raise PackageIntegrityError(
                    f"{path}: {name} is {blob.size} bytes, the manifest says {entry['size']}"
                )
            if _sha256(files[name]) != entry["sha256"]:
                raise PackageIntegrityError(f"{path}: {name} does not match its sha256 in the manifest")
        blobs[name] = blob
    graph_name, weights_name = manifest.get("graph", GRAPH), manifest.get("weights", WEIGHTS)
    if graph_name not in blobs or weights_name not in blobs:
        raise PackageError(f"{path}: the manifest must list {graph_name} and {weights_name}")
    try:
        graph = json.loads(bytes(blobs[graph_name]))
    except ValueError as exc:
        raise PackageError(f"{path}: {graph_name} is not valid JSON ({exc})") from exc
    weights = blobs[weights_name]
    tensors = {}
    for name, spec in graph.get("tensors", {}).items():
        end = spec["offset"] + spec["nbytes"]
        if end > weights.size:
            raise PackageIntegrityError(f"{path}: tensor {name!r} runs past the end of {weights_name}")
        raw = weights[spec["offset"] : end]
        tensors[name] = np.frombuffer(raw, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"])
    return Package(manifest=manifest, graph=graph, tensors=tensors, weights=weights)
