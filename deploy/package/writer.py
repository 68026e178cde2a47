"""Writing package archives, byte-for-byte deterministically and atomically.

An archive is an uncompressed USTAR tar (so the engine can map weights in place), members in
a fixed order: ``manifest.json``, then ``manifest.sig`` once signed, then the files in the
manifest's order.  Every header has the same mtime (0), mode (0644) and owner (0, no names),
so the same content gives the same bytes: converting a model twice, or re-running a crashed
signing job, gives the same package and the same digest.  Files are written to ``<dst>.tmp``,
fsynced and renamed, so a crash never leaves half a package under the final name.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from deploy.errors import UnsafeArchiveError
from deploy.package.digest import file_sha256
from deploy.package.manifest import MANIFEST, SIGNATURE, Manifest
from deploy.package.reader import member_reader
from deploy.package.signing import DEFAULT_CLAIMS, SignedClaims, sign_manifest

# One member to write: its name, its size and where its bytes come from.
Entry = tuple[str, int, IO[bytes]]


def _header(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info


def write_entries(dst: str | os.PathLike[str], entries: Iterable[Entry]) -> None:
    """Write entries to a deterministic tar at dst, atomically (temp file, fsync, rename)."""
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    with open(tmp, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, size, source in entries:
                tar.addfile(_header(name, size), source)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, dst)


def write_archive(dst: str | os.PathLike[str], members: list[tuple[str, bytes | Path]]) -> None:
    """Write (name, bytes or file) members, in this order, to a deterministic tar at dst."""
    with contextlib.ExitStack() as stack:
        entries = [
            (name, data.stat().st_size, stack.enter_context(open(data, "rb")))
            if isinstance(data, Path)
            else (name, len(data), io.BytesIO(data))
            for name, data in members
        ]
        write_entries(dst, entries)


def write_package(
    dst: str | os.PathLike[str],
    *,
    files: list[tuple[str, bytes | Path]],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write an unsigned package of these files (the manifest lists them in this order); return
    its manifest.  The converter passes the engine's model files (graph.json, weights.bin),
    as bytes or as the files holding them (a model's weights may be several GB)."""
    manifest = Manifest.listing(files, inputs=inputs, outputs=outputs, metadata=metadata)
    write_archive(dst, [(MANIFEST, manifest.to_bytes()), *files])
    return manifest.as_dict()


def sign_package(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    private_key: bytes,
    claims: SignedClaims = DEFAULT_CLAIMS,
) -> str:
    """Copy the package at src to dst with manifest.sig (re)placed right after the manifest.

    src may be unsigned or already signed (its files are copied untouched).  Returns the
    sha256 of the signed archive.
    The output is byte-for-byte the same for the same input, key and claims, so
    re-running a crashed job gives the same package.
    """
    with tarfile.open(src, mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.name != SIGNATURE]
        if not members or members[0].name != MANIFEST or not members[0].isfile():
            raise UnsafeArchiveError(f"{src}: the first member must be {MANIFEST}")
        manifest = member_reader(tar, members[0]).read()
        signature = sign_manifest(manifest, private_key, claims)
        write_entries(dst, _signed_entries(src, tar, members[1:], manifest, signature))
    return file_sha256(dst)


def _signed_entries(
    src: str | os.PathLike[str],
    tar: tarfile.TarFile,
    files: list[tarfile.TarInfo],
    manifest: bytes,
    signature: bytes,
) -> Iterable[Entry]:
    yield MANIFEST, len(manifest), io.BytesIO(manifest)
    yield SIGNATURE, len(signature), io.BytesIO(signature)
    for member in files:
        if not member.isfile():
            raise UnsafeArchiveError(f"{src}: member {member.name!r} is not a regular file")
        yield member.name, member.size, member_reader(tar, member)
