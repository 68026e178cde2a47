"""The one place the package library hashes bytes.

Every sha256 the library takes of a package's bytes (the manifest for its signature, each
file while it streams to disk, a whole archive) starts here, so "each byte is hashed once per
activation" can be checked by counting what passes through ``sha256`` (tests do).
"""

from __future__ import annotations

import hashlib
import os
from typing import Protocol

CHUNK = 1 << 20  # bytes read at a time when hashing a file


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def sha256(data: bytes = b"") -> Digest:
    """A new sha256 over data (more with ``update``)."""
    return hashlib.sha256(data)


def bytes_sha256(data: bytes) -> str:
    return sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a whole file, read in CHUNK-sized blocks (never resident at once)."""
    digest = sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()
