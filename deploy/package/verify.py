"""Verify a signed package and unpack it, refusing anything unsafe, in one pass over its bytes.

Order matters: the signature is checked on the manifest before any other member is read,
the claims check (device class, organisation, the assigned manifest digest) runs before
anything is written but the manifest, and every file is hashed while it streams to disk, so
a tampered, oversized or hostile archive is refused without ever being trusted.  The
archive is read once, forward only, and each byte of it is hashed at most once (the manifest
for the signature, each file against its listed sha256).  The caller unpacks into a fresh
directory and switches to it atomically only after this returns.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from deploy.errors import IntegrityError, UnsafeArchiveError
from deploy.package import digest
from deploy.package.manifest import MANIFEST, listed_files
from deploy.package.reader import MAX_MANIFEST_BYTES, member_reader, open_stream, read_head, safe_name
from deploy.package.signing import SignedClaims, VerifiedManifest, verify_envelope

__all__ = [
    "MAX_ENTRIES",
    "MAX_MANIFEST_BYTES",
    "MAX_TOTAL_BYTES",
    "ClaimsCheck",
    "UnpackLimits",
    "VerifiedPackage",
    "verify_and_unpack",
]

# Called with the verified claims and manifest before any other member is read; raises
# PackageRejected to refuse (wrong device class or organisation, not the assigned manifest).
ClaimsCheck = Callable[[VerifiedManifest], None]

MAX_ENTRIES = 64
MAX_TOTAL_BYTES = 2 << 30


@dataclass(frozen=True)
class UnpackLimits:
    max_entries: int = MAX_ENTRIES
    max_total_bytes: int = MAX_TOTAL_BYTES


@dataclass
class VerifiedPackage:
    manifest: dict[str, Any]
    files: list[str] = field(default_factory=list)
    claims: SignedClaims = field(default_factory=SignedClaims)


def _copy_hashed(source: IO[bytes], dest: Path, limit: int) -> tuple[str, int]:
    """Copy source to the new file dest, hashing each block as it passes; stop past limit."""
    hasher, size = digest.sha256(), 0
    with open(dest, "xb") as out:
        for block in iter(lambda: source.read(digest.CHUNK), b""):
            size += len(block)
            if size > limit:
                raise IntegrityError(f"{dest.name} is larger than the {limit} bytes its manifest signs")
            hasher.update(block)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return hasher.hexdigest(), size


def verify_and_unpack(
    archive: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    public_key: bytes,
    limits: UnpackLimits = UnpackLimits(),
    check: ClaimsCheck | None = None,
) -> VerifiedPackage:
    """Verify archive against public_key and unpack its files into the new directory dest.

    ``check`` sees the signed claims and the manifest's digest before anything but the
    manifest is read, so a package for another device class or tenant, or not the one the
    device's assignment names, is never unpacked.
    """
    dest = Path(dest)
    dest.mkdir(parents=True)
    try:
        with open_stream(archive) as tar:  # streaming: members are read in order, once
            manifest_bytes, signature = read_head(tar, unpacking=True)
            verified = verify_envelope(manifest_bytes, signature, public_key)
            if check is not None:
                check(verified)
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


def _check_listing(listed: dict[str, dict[str, Any]], limits: UnpackLimits) -> None:
    if len(listed) + 2 > limits.max_entries:
        raise UnsafeArchiveError(
            f"the manifest lists {len(listed)} files, over the {limits.max_entries} limit"
        )
    if sum(int(e["size"]) for e in listed.values()) > limits.max_total_bytes:
        raise UnsafeArchiveError(f"the package unpacks to more than {limits.max_total_bytes} bytes")


def _unpack_listed(
    tar: tarfile.TarFile, manifest: dict[str, Any], dest: Path, limits: UnpackLimits
) -> VerifiedPackage:
    listed = listed_files(manifest)
    _check_listing(listed, limits)
    seen: list[str] = []
    while (member := tar.next()) is not None:  # not `for m in tar`: that restarts at the manifest
        name = safe_name(member)
        entry = listed.get(name)
        if entry is None or name in seen:
            raise UnsafeArchiveError(f"member {name!r} is not listed in the signed manifest (or repeats)")
        hexdigest, size = _copy_hashed(member_reader(tar, member), dest / name, int(entry["size"]))
        if size != entry["size"] or hexdigest != entry["sha256"]:
            raise IntegrityError(f"{name} does not match the sha256 and size in the signed manifest")
        seen.append(name)
    missing = sorted(set(listed) - set(seen))
    if missing:
        raise IntegrityError(f"the signed manifest lists {', '.join(missing)} but the package lacks them")
    return VerifiedPackage(manifest=manifest, files=seen)
