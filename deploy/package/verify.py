"""Verify a signed package and unpack it, refusing anything unsafe.

Order matters: the signature is checked on the manifest before any other member is
read, and every file is hashed while it streams to disk, so a tampered, oversized or
hostile archive is refused without ever being trusted.  The caller unpacks into a
fresh directory and switches to it atomically only after this returns.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from deploy.errors import IntegrityError, SignatureError, UnsafeArchiveError
from deploy.package.signing import MANIFEST, SIGNATURE, SignedClaims, verify_envelope

# Called with the verified claims and manifest before any other member is read; raises
# PackageRejected to refuse (wrong device class, older counter, ...).
ClaimsCheck = Callable[[SignedClaims, dict[str, Any]], None]

MAX_ENTRIES = 64
MAX_TOTAL_BYTES = 2 << 30
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class UnpackLimits:
    max_entries: int = MAX_ENTRIES
    max_total_bytes: int = MAX_TOTAL_BYTES


@dataclass
class VerifiedPackage:
    manifest: dict[str, Any]
    files: list[str] = field(default_factory=list)
    claims: SignedClaims = field(default_factory=SignedClaims)


def _safe_name(member: tarfile.TarInfo) -> str:
    if not member.isfile():
        raise UnsafeArchiveError(
            f"member {member.name!r} is not a regular file (links and devices are refused)"
        )
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or len(path.parts) != 1 or member.name in ("", "."):
        raise UnsafeArchiveError(f"member {member.name!r} has an unsafe path")
    return member.name


def _read_small(tar: tarfile.TarFile, member: tarfile.TarInfo | None, expected: str) -> bytes:
    if member is None or member.name != expected:
        found = "nothing" if member is None else repr(member.name)
        raise SignatureError(f"expected {expected} here, found {found}: the package is not signed")
    _safe_name(member)
    if member.size > MAX_MANIFEST_BYTES:
        raise UnsafeArchiveError(f"{expected} is {member.size} bytes, over the {MAX_MANIFEST_BYTES} limit")
    return tar.extractfile(member).read()


def _copy_hashed(source, dest: Path, limit: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(dest, "xb") as out:
        for block in iter(lambda: source.read(1 << 20), b""):
            size += len(block)
            if size > limit:
                raise IntegrityError(f"{dest.name} is larger than the {limit} bytes its manifest signs")
            digest.update(block)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest(), size


def verify_and_unpack(
    archive: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    public_key: bytes,
    limits: UnpackLimits = UnpackLimits(),
    check: ClaimsCheck | None = None,
) -> VerifiedPackage:
    """Verify archive against public_key and unpack its files into the new directory dest.

    ``check`` sees the signed claims before anything but the manifest is read, so a
    package for another device class or older than the running one is never unpacked.
    """
    dest = Path(dest)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive, mode="r|") as tar:  # streaming: members are read in order, once
            manifest_bytes = _read_small(tar, tar.next(), MANIFEST)
            verified = verify_envelope(manifest_bytes, _read_small(tar, tar.next(), SIGNATURE), public_key)
            if check is not None:
                check(verified.claims, verified.manifest)
            (dest / MANIFEST).write_bytes(manifest_bytes)
            package = _unpack_listed(tar, verified.manifest, dest, limits)
            package.claims = verified.claims
            return package
    except tarfile.TarError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise UnsafeArchiveError(f"{archive}: not a readable package archive ({exc})") from exc
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # never leave a half-unpacked version behind
        raise


def _unpack_listed(
    tar: tarfile.TarFile, manifest: dict[str, Any], dest: Path, limits: UnpackLimits
) -> VerifiedPackage:
    listed = {entry["path"]: entry for entry in manifest.get("files", [])}
    if len(listed) + 2 > limits.max_entries:
        raise UnsafeArchiveError(
            f"the manifest lists {len(listed)} files, over the {limits.max_entries} limit"
        )
    if sum(int(e["size"]) for e in listed.values()) > limits.max_total_bytes:
        raise UnsafeArchiveError(f"the package unpacks to more than {limits.max_total_bytes} bytes")
    seen: list[str] = []
    while (member := tar.next()) is not None:  # not `for m in tar`: that restarts at the manifest
        name = _safe_name(member)
        entry = listed.get(name)
        if entry is None or name in seen:
            raise UnsafeArchiveError(f"member {name!r} is not listed in the signed manifest (or repeats)")
        digest, size = _copy_hashed(tar.extractfile(member), dest / name, int(entry["size"]))
        if size != entry["size"] or digest != entry["sha256"]:
            raise IntegrityError(f"{name} does not match the sha256 and size in the signed manifest")
        seen.append(name)
    missing = sorted(set(listed) - set(seen))
    if missing:
        raise IntegrityError(f"the signed manifest lists {', '.join(missing)} but the package lacks them")
    return VerifiedPackage(manifest=manifest, files=seen)
