"""Verify-and-unpack: the signature first, the claims before any file is written, one pass that
hashes each byte once, and the limits."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from deploy.errors import PackageRejected, UnsafeArchiveError
from deploy.package import UnpackLimits, digest, verify_and_unpack
from tests.deploy.package.helpers import FILES, KEYS, signed


def test_one_pass_hashes_the_manifest_and_each_file_once(tmp_path: Path, monkeypatch):
    archive = signed(tmp_path)
    hashed: list[int] = []
    real = digest.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self._inner = real()
            self.update(data)

        def update(self, block: bytes) -> None:
            hashed.append(len(block))
            self._inner.update(block)

        def hexdigest(self) -> str:
            return self._inner.hexdigest()

    monkeypatch.setattr(digest, "sha256", Counting)
    result = verify_and_unpack(archive, tmp_path / "out", KEYS.public_key)
    manifest_size = (tmp_path / "out" / "manifest.json").stat().st_size
    assert sum(hashed) == manifest_size + sum(len(data) for _, data in FILES)
    assert result.files == ["graph.json", "weights.bin"]


def test_the_claims_check_runs_before_anything_is_written(tmp_path: Path):
    archive = signed(tmp_path)
    seen: list[list[str]] = []

    def check(verified) -> None:
        seen.append(sorted(p.name for p in (tmp_path / "out").iterdir()))
        raise PackageRejected(f"organisation {verified.claims.organisation} is not this device's")

    with pytest.raises(PackageRejected, match="organisation 7 is not"):
        verify_and_unpack(archive, tmp_path / "out", KEYS.public_key, check=check)
    assert seen == [[]]
    assert not (tmp_path / "out").exists()


def test_the_size_limit_is_checked_on_the_signed_listing(tmp_path: Path):
    archive = signed(tmp_path)
    with pytest.raises(UnsafeArchiveError, match="unpacks to more than 100 bytes"):
        verify_and_unpack(archive, tmp_path / "out", KEYS.public_key, UnpackLimits(max_total_bytes=100))
    assert not (tmp_path / "out").exists()


def test_the_archive_is_read_forward_only(tmp_path: Path, monkeypatch):
    """Streaming mode: tarfile never seeks back, so each byte of the file is read once."""
    archive = signed(tmp_path)
    modes: list[str] = []
    real_open = tarfile.open

    def recording(*args, **kwargs):
        modes.append(kwargs.get("mode", args[1] if len(args) > 1 else "r"))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(tarfile, "open", recording)
    verify_and_unpack(archive, tmp_path / "out", KEYS.public_key)
    assert modes == ["r|"]
