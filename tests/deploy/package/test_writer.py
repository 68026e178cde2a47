"""Deterministic, atomic archives: the same input gives the same bytes, pinned here."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

from deploy.package import SignedClaims, digest, sign_package
from tests.deploy.package.helpers import KEYS, signed, unsigned

# The bytes of helpers.unsigned(): a change here changes every package's digest (and the
# registry stores packages by digest), so it must be deliberate.
UNSIGNED_SHA256 = "be353c2f4115b20670069b0972c859d1c07304f325379b257494eb8df9459413"


def test_package_bytes_are_pinned(tmp_path: Path):
    assert digest.file_sha256(unsigned(tmp_path / "p.ferry")) == UNSIGNED_SHA256


def test_headers_are_fixed_and_members_ordered(tmp_path: Path):
    with tarfile.open(signed(tmp_path)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["manifest.json", "manifest.sig", "graph.json", "weights.bin"]
    assert {(m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0o644, 0, 0, "", "")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signed.ferry", "unsigned.ferry"]  # no .tmp


def test_signing_returns_the_archive_digest_and_is_deterministic(tmp_path: Path):
    source = unsigned(tmp_path / "u.ferry")
    first = sign_package(source, tmp_path / "a.ferry", KEYS.private_key, SignedClaims(organisation="1"))
    second = sign_package(source, tmp_path / "b.ferry", KEYS.private_key, SignedClaims(organisation="1"))
    assert first == second == hashlib.sha256((tmp_path / "a.ferry").read_bytes()).hexdigest()


def test_re_signing_replaces_the_signature_and_copies_the_files_untouched(tmp_path: Path):
    first = signed(tmp_path)
    again = tmp_path / "again.ferry"
    sign_package(first, again, KEYS.private_key, SignedClaims(device_class="pi4", organisation="9"))

    def contents(path: Path) -> dict[str, bytes]:
        with tarfile.open(path) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}

    before, after = contents(first), contents(again)
    assert list(after) == list(before)
    assert {k: v for k, v in after.items() if k != "manifest.sig"} == {
        k: v for k, v in before.items() if k != "manifest.sig"
    }
    assert after["manifest.sig"] != before["manifest.sig"]
