"""All bytes go through Django's storage API: local files by default, S3 when configured."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from django.core.files import File
from django.core.files.storage import default_storage


def sha256_of(stream: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
        size += len(block)
    stream.seek(0)
    return digest.hexdigest(), size


def save_content_addressed(prefix: str, digest: str, suffix: str, stream: BinaryIO) -> str:
    """Store the stream under prefix/digest+suffix, once: the same bytes always get the same name."""
    name = f"{prefix}/{digest}{suffix}"
    if not default_storage.exists(name):
        saved = default_storage.save(name, File(stream, name=os.path.basename(name)))
        if saved != name:  # lost a race to an identical upload: keep one copy
            default_storage.delete(saved)
    return name


@contextmanager
def local_copy(name: str, suffix: str = "") -> Iterator[Path]:
    """A temporary local file with the stored object's bytes (conversion needs a real path)."""
    with tempfile.TemporaryDirectory(prefix="ferry-") as tmp:
        path = Path(tmp) / f"object{suffix}"
        with default_storage.open(name, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        yield path


def open_at(name: str, offset: int) -> BinaryIO:
    stream = default_storage.open(name, "rb")
    stream.seek(offset)
    return stream
