"""Checkpoint archives (a tar, optionally compressed, or a zip of a checkpoint directory): checked
at upload, extracted by the conversion worker, both with the same rules.

An archive is hostile until proven otherwise: a member with an absolute path or '..' would write
outside the extraction directory, a link could point anywhere, a device file or FIFO is never a
checkpoint, and a small archive can declare (or really hold) far more bytes than it weighs.
Every member is checked against these rules and the archive is refused naming the first that
breaks one. Extraction never uses tarfile/zipfile's own extract: only regular files and
directories are written, by us, and the bytes written are counted as they are written.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from django.conf import settings

from registry.errors import InvalidUpload

MAX_MEMBERS = 4096  # a sharded checkpoint has tens of files; thousands is something else
CHUNK = 1 << 20


class UnsafeArchive(InvalidUpload):
    code = "unsafe_archive"


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    is_dir: bool


def max_unpacked_bytes() -> int:
    """Unpacked bytes allowed: the upload limit times the compression a checkpoint may have."""
    return getattr(settings, "FERRY_MAX_UNPACKED_BYTES", 4 * settings.FERRY_MAX_UPLOAD_BYTES)


def archive_suffix(stream: BinaryIO) -> str:
    """'.zip' or '.tar' for what the stream holds; refused when it is neither."""
    stream.seek(0)
    is_zip = zipfile.is_zipfile(stream)
    stream.seek(0)
    if is_zip:
        return ".zip"
    try:
        with tarfile.open(fileobj=stream, mode="r:*") as tar:
            tar.next()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidUpload(
            f"The upload is not a tar or zip archive ({exc}); for kind llm or diffusion upload "
            "the checkpoint directory as one archive (e.g. tar czf model.tgz model/)."
        ) from None
    finally:
        stream.seek(0)
    return ".tar"


def check_archive(stream: BinaryIO) -> list[Member]:
    """Every member of the archive, checked; raises UnsafeArchive naming the first refused one."""
    budget = _Budget()
    members = [budget.take(member) for member, _ in _tar_or_zip(stream, with_streams=False)]
    stream.seek(0)
    if not any(not m.is_dir for m in members):
        raise InvalidUpload("The archive holds no files.")
    return members


def extract_archive(path: Path, dest: Path) -> Path:
    """Extract the archive at ``path`` under ``dest`` (the same checks as at upload); return the
    checkpoint's directory: ``dest`` itself, or its one top-level directory when that is all."""
    budget = _Budget()
    with open(path, "rb") as stream:
        for member, source in _tar_or_zip(stream, with_streams=True):
            budget.take(member)
            target = dest.joinpath(*PurePosixPath(member.name).parts)
            try:
                if member.is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                _copy_counted(source, target, member.name, budget)
            except OSError as exc:  # e.g. a file member where an earlier one made a directory
                raise UnsafeArchive(
                    f"Archive member {member.name!r} cannot be extracted ({exc.strerror})."
                ) from None
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest


class _Budget:
    """The member count and the unpacked bytes so far, against their limits."""

    def __init__(self) -> None:
        self.members, self.declared, self.written, self.limit = 0, 0, 0, max_unpacked_bytes()

    def take(self, member: Member) -> Member:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise UnsafeArchive(
                f"Archive member {member.name!r}: the archive has more than {MAX_MEMBERS} members."
            )
        self.declared += member.size
        if self.declared > self.limit:
            raise self.too_big(member.name)
        return member

    def too_big(self, name: str) -> UnsafeArchive:
        return UnsafeArchive(f"Archive member {name!r}: the archive unpacks past {self.limit:,} bytes.")


def _copy_counted(source: BinaryIO, target: Path, name: str, budget: _Budget) -> None:
    """Copy a member's bytes, counting them: a member's declared size can lie."""
    with open(target, "wb") as out:
        for block in iter(lambda: source.read(CHUNK), b""):
            budget.written += len(block)
            if budget.written > budget.limit:
                raise budget.too_big(name)
            out.write(block)


def _tar_or_zip(stream: BinaryIO, *, with_streams: bool) -> Iterator[tuple[Member, BinaryIO | None]]:
    stream.seek(0)
    if zipfile.is_zipfile(stream):
        stream.seek(0)
        yield from _zip_members(stream, with_streams)
    else:
        stream.seek(0)
        yield from _tar_members(stream, with_streams)


def _tar_members(stream: BinaryIO, with_streams: bool) -> Iterator[tuple[Member, BinaryIO | None]]:
    try:
        with tarfile.open(fileobj=stream, mode="r:*") as tar:
            for info in tar:
                if not (info.isfile() or info.isdir()):
                    what = (
                        "a link" if info.issym() or info.islnk() else "a device file, FIFO or other special"
                    )
                    raise UnsafeArchive(
                        f"Archive member {info.name!r} is {what}; only regular files and directories "
                        "are accepted."
                    )
                member = Member(_safe_name(info.name), info.size, info.isdir())
                source = tar.extractfile(info) if with_streams and info.isfile() else None
                yield member, source
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidUpload(f"The archive is damaged or truncated ({exc}).") from None


def _zip_members(stream: BinaryIO, with_streams: bool) -> Iterator[tuple[Member, BinaryIO | None]]:
    try:
        with zipfile.ZipFile(stream) as archive:
            for info in archive.infolist():
                mode = (info.external_attr >> 16) & 0o170000
                if mode and mode not in (0o100000, 0o040000):  # S_IFREG, S_IFDIR
                    kind = "a link" if mode == 0o120000 else "a device file, FIFO or other special"
                    raise UnsafeArchive(
                        f"Archive member {info.filename!r} is {kind}; only regular files and directories "
                        "are accepted."
                    )
                member = Member(_safe_name(info.filename), info.file_size, info.is_dir())
                if with_streams and not info.is_dir():
                    with archive.open(info) as source:
                        yield member, source
                else:
                    yield member, None
    except (zipfile.BadZipFile, EOFError) as exc:
        raise InvalidUpload(f"The archive is damaged or truncated ({exc}).") from None


def _safe_name(name: str) -> str:
    """The member's name as a relative path inside the extraction directory, or a refusal."""
    if "\x00" in name or "\\" in name:
        raise UnsafeArchive(f"Archive member {name!r} has a NUL or backslash in its name.")
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        raise UnsafeArchive(f"Archive member {name!r} has an absolute path.")
    if ".." in path.parts:
        raise UnsafeArchive(f"Archive member {name!r} has '..' in its path.")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        return "."
    return "/".join(parts)
