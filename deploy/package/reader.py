"""Reading a package archive as a stream: members in order, each read once, never seeked back.

The first two members are the manifest and its signature (``read_head``); a caller checks the
signature before it reads anything else (``read_claims`` stops there).  ``safe_name`` holds
the unpacking rules every other member must pass: a regular file, a plain name, no
directory, no absolute path, no ``..``, no link or device.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath
from typing import IO

from deploy.errors import SignatureError, UnsafeArchiveError
from deploy.package.manifest import MANIFEST, SIGNATURE
from deploy.package.signing import VerifiedManifest, verify_envelope

MAX_MANIFEST_BYTES = 1 << 20


@contextmanager
def open_stream(archive: str | os.PathLike[str]) -> Iterator[tarfile.TarFile]:
    """The archive as a forward-only stream of members (``tarfile`` mode ``r|``)."""
    with tarfile.open(archive, mode="r|") as tar:
        yield tar


def safe_name(member: tarfile.TarInfo) -> str:
    """The member's name if it may be unpacked, else UnsafeArchiveError."""
    if not member.isfile():
        raise UnsafeArchiveError(
            f"member {member.name!r} is not a regular file (links and devices are refused)"
        )
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or len(path.parts) != 1 or member.name in ("", "."):
        raise UnsafeArchiveError(f"member {member.name!r} has an unsafe path")
    return member.name


def read_small(tar: tarfile.TarFile, expected: str, *, unpacking: bool) -> bytes:
    """The next member, which must be ``expected`` (the manifest or its signature) and small.

    When ``unpacking``, a misplaced member is also held to the unpacking rules (an unsafe one
    is UnsafeArchiveError); a claims read only needs a regular file of that name.
    """
    member = tar.next()
    wrong = member is None or member.name != expected or (not unpacking and not member.isfile())
    if wrong:
        found = "nothing" if member is None else repr(member.name)
        raise SignatureError(f"expected {expected} here, found {found}: the package is not signed")
    if unpacking:
        safe_name(member)
    if member.size > MAX_MANIFEST_BYTES:
        raise UnsafeArchiveError(f"{expected} is {member.size} bytes, over the {MAX_MANIFEST_BYTES} limit")
    return member_reader(tar, member).read()


def member_reader(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    reader = tar.extractfile(member)
    assert reader is not None  # a regular file always has a reader
    return reader


def read_head(tar: tarfile.TarFile, *, unpacking: bool) -> tuple[bytes, bytes]:
    """The manifest's and the signature's bytes: the archive's first two members."""
    manifest = read_small(tar, MANIFEST, unpacking=unpacking)
    return manifest, read_small(tar, SIGNATURE, unpacking=unpacking)


def read_claims(archive: str | os.PathLike[str], public_key: bytes) -> VerifiedManifest:
    """Verify only the first two members (manifest and signature) and return the signed claims."""
    with open_stream(archive) as tar:
        manifest, signature = read_head(tar, unpacking=False)
        return verify_envelope(manifest, signature, public_key)
