"""Streaming reads: the head (manifest, signature) alone, and the unpacking rules for members."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from deploy.errors import SignatureError, UnsafeArchiveError
from deploy.package import reader
from tests.deploy.package.helpers import KEYS, signed, unsigned


def _member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


def test_safe_name_accepts_plain_file_names_only():
    assert reader.safe_name(_member("weights.bin")) == "weights.bin"
    for name in ("/etc/passwd", "../evil", "a/b", ".", ""):
        with pytest.raises(UnsafeArchiveError, match="unsafe path"):
            reader.safe_name(_member(name))
    for kind in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.CHRTYPE):
        with pytest.raises(UnsafeArchiveError, match="not a regular file"):
            reader.safe_name(_member("graph.json", kind))


def test_claims_are_read_from_the_head_alone(tmp_path: Path):
    archive = signed(tmp_path)
    with tarfile.open(archive) as tar:
        end_of_head = tar.getmember("graph.json").offset  # where the signature member ends
    head_only = tmp_path / "head.ferry"
    head_only.write_bytes(archive.read_bytes()[:end_of_head])
    verified = reader.read_claims(head_only, KEYS.public_key)
    assert verified.claims.organisation == "7"
    assert verified.manifest["metadata"] == {"note": "test"}


def test_an_unsigned_package_has_no_claims(tmp_path: Path):
    with pytest.raises(SignatureError, match="expected manifest.sig here, found 'graph.json'"):
        reader.read_claims(unsigned(tmp_path / "u.ferry"), KEYS.public_key)
