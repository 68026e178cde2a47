"""The Ferry package format: what the converter writes and the engine (and agent) read.

A package is an uncompressed tar archive (so weights can be memory-mapped in place) with:

- ``manifest.json`` — always the first member: format version, model inputs/outputs,
  and every other file with its sha256 and size, plus free-form ``metadata``
  (converter options, accuracy report, self-test vectors).
- ``manifest.sig`` — optional second member, added by ``deploy.signing``; the engine ignores it.
- ``graph.json`` — nodes in topological order, graph inputs/outputs, and a table of
  tensors (initializers) giving each one's dtype, shape and byte offset in the weights file.
- ``weights.bin`` — the raw little-endian tensors, each starting on a 64-byte boundary.

Format versions: v1, the first; v2 (2026-11) lets graph.json carry what a v1 engine would
silently ignore and so compute wrong results with: FusedAttention's ``views``, ``out_view``
and ``q_log2e``, and FusedConv's fourth input (a residual added before the activation).
The converter writes the newest version; the engine reads every version up to its own, so
packages already on devices keep loading after an engine update, and refuses newer ones
with a message saying to update.

An unpacked package is a directory holding the same files.  Archives are written
byte-for-byte deterministically (sorted keys, fixed mtime/owner/mode), so converting the
same model twice gives the same bytes.
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
from typing import Any

import numpy as np

from engine.errors import PackageError, PackageIntegrityError

FORMAT = "ferry-package"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
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


def pack_tensors(tensors: dict[str, np.ndarray]) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """Lay tensors out in one buffer, each 64-byte aligned; return the buffer and its table."""
    buf = io.BytesIO()
    table: dict[str, dict[str, Any]] = {}
    for name in sorted(tensors):
        # not np.ascontiguousarray: it turns 0-d tensors (scalar Gather indices...) into 1-d
        array = np.asarray(tensors[name], order="C")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        pad = (-buf.tell()) % ALIGNMENT
        buf.write(b"\0" * pad)
        table[name] = {
            "dtype": array.dtype.name,
            "shape": list(array.shape),
            "offset": buf.tell(),
            "nbytes": int(array.nbytes),
        }
        buf.write(array.tobytes())
    return buf.getvalue(), table


def file_entry(path: str, data: bytes) -> dict[str, Any]:
    return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def build_members(
    *,
    graph: dict[str, Any],
    tensors: dict[str, np.ndarray],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
) -> list[tuple[str, bytes]]:
    """The package's files, manifest first, as (name, bytes) pairs."""
    weights, table = pack_tensors(tensors)
    graph_bytes = canonical_json({**graph, "tensors": table})
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "graph": GRAPH,
        "weights": WEIGHTS,
        "inputs": inputs,
        "outputs": outputs,
        "files": [file_entry(GRAPH, graph_bytes), file_entry(WEIGHTS, weights)],
        "metadata": metadata or {},
    }
    return [(MANIFEST, canonical_json(manifest)), (GRAPH, graph_bytes), (WEIGHTS, weights)]


def write_archive(dst: str | os.PathLike[str], members: list[tuple[str, bytes]]) -> None:
    """Write members to a deterministic tar at dst, atomically (temp file, fsync, rename)."""
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    with open(tmp, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, dst)


def write_package(
    dst: str | os.PathLike[str],
    *,
    graph: dict[str, Any],
    tensors: dict[str, np.ndarray],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a package file; return its manifest.

    ``graph`` holds ``nodes`` (each ``{"name", "op", "inputs", "outputs", "attrs"}``),
    ``inputs`` and ``outputs`` (lists of value names); its ``tensors`` table is filled in here.
    """
    members = build_members(graph=graph, tensors=tensors, inputs=inputs, outputs=outputs, metadata=metadata)
    write_archive(dst, members)
    return json.loads(members[0][1])


def _open_files(path: Path) -> dict[str, tuple[Path, int, int]]:
    """Map member name -> (file, offset, size) for an archive or an unpacked directory."""
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


def read_package(path: str | os.PathLike[str], *, verify: bool = True) -> Package:
    """Load a package file or directory; raise PackageError / PackageIntegrityError if it is bad."""
    path = Path(path)
    if not path.exists():
        raise PackageError(f"{path}: no such package")
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
