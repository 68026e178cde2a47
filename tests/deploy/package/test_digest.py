"""The library's one sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

from deploy.package import digest


def test_file_sha256_reads_in_blocks_and_matches_hashlib(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(digest, "CHUNK", 7)
    data = bytes(range(256)) * 3 + b"tail"
    (tmp_path / "f").write_bytes(data)
    assert digest.file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    assert digest.bytes_sha256(data) == hashlib.sha256(data).hexdigest()


def test_every_hash_goes_through_sha256(tmp_path: Path, monkeypatch):
    seen: list[bytes] = []
    real = digest.sha256

    def counting(data: bytes = b"") -> digest.Digest:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(digest, "sha256", counting)
    (tmp_path / "f").write_bytes(b"abc")
    digest.file_sha256(tmp_path / "f")
    digest.bytes_sha256(b"xyz")
    assert seen == [b"", b"xyz"]
