"""Package signing and the device-side verify-then-unpack, fed every kind of bad package."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from deploy.errors import IntegrityError, PackageRejected, SignatureError, UnsafeArchiveError
from deploy.package import (
    SignedClaims,
    UnpackLimits,
    generate_keypair,
    read_claims,
    sign_package,
    verify_and_unpack,
    write_package,
)
from engine.format import model_files

KEYS = generate_keypair()


def _unsigned(path: Path) -> Path:
    graph = {
        "nodes": [{"name": "r", "op": "Relu", "inputs": ["x"], "outputs": ["y"], "attrs": {}}],
        "inputs": ["x"],
        "outputs": ["y"],
    }
    write_package(
        path,
        files=model_files(graph=graph, tensors={"w": np.arange(16, dtype=np.float32)}),
        inputs=[{"name": "x", "dtype": "float32", "shape": [1, 4]}],
        outputs=[{"name": "y", "dtype": "float32", "shape": [1, 4]}],
    )
    return path


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    sign_package(_unsigned(tmp_path / "unsigned.ferry"), tmp_path / "signed.ferry", KEYS.private_key)
    return tmp_path / "signed.ferry"


def _members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]


def _rewrite(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    out = path.with_name("tampered.ferry")
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out


def test_signed_package_unpacks_whole(signed: Path, tmp_path: Path):
    result = verify_and_unpack(signed, tmp_path / "out", KEYS.public_key)
    assert sorted(result.files) == ["graph.json", "weights.bin"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "graph.json",
        "manifest.json",
        "weights.bin",
    ]


def test_signing_is_deterministic(tmp_path: Path):
    unsigned = _unsigned(tmp_path / "u.ferry")
    first = sign_package(unsigned, tmp_path / "a.ferry", KEYS.private_key)
    second = sign_package(unsigned, tmp_path / "b.ferry", KEYS.private_key)
    assert first == second
    assert (tmp_path / "a.ferry").read_bytes() == (tmp_path / "b.ferry").read_bytes()


def test_other_key_is_refused_and_nothing_is_left(signed: Path, tmp_path: Path):
    with pytest.raises(SignatureError, match="does not verify against the trusted release key"):
        verify_and_unpack(signed, tmp_path / "out", generate_keypair().public_key)
    assert not (tmp_path / "out").exists()


def test_unsigned_package_is_refused(tmp_path: Path):
    with pytest.raises(SignatureError, match="not signed"):
        verify_and_unpack(_unsigned(tmp_path / "u.ferry"), tmp_path / "out", KEYS.public_key)


def test_tampered_weights_are_refused(signed: Path, tmp_path: Path):
    members = _members(signed)
    info, data = members[-1]
    members[-1] = (info, bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(IntegrityError, match="weights.bin does not match"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)
    assert not (tmp_path / "out").exists()


def test_tampered_manifest_is_refused(signed: Path, tmp_path: Path):
    members = _members(signed)
    manifest = json.loads(members[0][1])
    manifest["files"][1]["size"] += 1
    members[0] = (members[0][0], json.dumps(manifest).encode())
    with pytest.raises(SignatureError):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)


def test_bigger_file_than_signed_is_refused(signed: Path, tmp_path: Path):
    members = _members(signed)
    info, data = members[-1]
    members[-1] = (info, data + b"\0" * 4096)
    with pytest.raises(IntegrityError, match="larger than"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "sub/dir"])
def test_unsafe_paths_are_refused(signed: Path, tmp_path: Path, name: str):
    members = _members(signed)
    info = tarfile.TarInfo(name)
    members.append((info, b"x"))
    with pytest.raises(UnsafeArchiveError, match="unsafe path"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "evil").exists()


def test_links_are_refused(signed: Path, tmp_path: Path):
    members = _members(signed)
    link = tarfile.TarInfo("weights.bin")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    members[-1] = (link, b"")
    with pytest.raises(UnsafeArchiveError, match="not a regular file"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)


def test_missing_listed_file_is_refused(signed: Path, tmp_path: Path):
    members = _members(signed)[:-1]
    with pytest.raises(IntegrityError, match="lacks them"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)


def test_entry_limit(signed: Path, tmp_path: Path):
    with pytest.raises(UnsafeArchiveError, match="over the 3 limit"):
        verify_and_unpack(signed, tmp_path / "out", KEYS.public_key, UnpackLimits(max_entries=3))


def test_garbage_is_refused(tmp_path: Path):
    junk = tmp_path / "junk.ferry"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(UnsafeArchiveError, match="not a readable package archive"):
        verify_and_unpack(junk, tmp_path / "out", KEYS.public_key)


def test_claims_travel_signed_in_the_envelope(tmp_path: Path):
    unsigned = _unsigned(tmp_path / "u.ferry")
    claims = SignedClaims(device_class="pi4", organisation="7")
    sign_package(unsigned, tmp_path / "s.ferry", KEYS.private_key, claims)
    assert read_claims(tmp_path / "s.ferry", KEYS.public_key).claims == claims
    result = verify_and_unpack(tmp_path / "s.ferry", tmp_path / "out", KEYS.public_key)
    assert result.claims == claims
    envelope = json.loads(_members(tmp_path / "s.ferry")[1][1])
    assert (envelope["device_class"], envelope["organisation"]) == ("pi4", "7")
    assert "counter" not in envelope and "rollback" not in envelope  # a package is signed once


@pytest.mark.parametrize("field,value", [("organisation", "99"), ("device_class", "pi4")])
def test_altered_claims_break_the_signature(signed: Path, tmp_path: Path, field: str, value):
    members = _members(signed)
    envelope = json.loads(members[1][1])
    envelope[field] = value
    members[1] = (members[1][0], json.dumps(envelope).encode())
    with pytest.raises(SignatureError, match="claims were altered"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)
    assert not (tmp_path / "out").exists()


def test_envelope_without_claims_is_malformed(signed: Path, tmp_path: Path):
    members = _members(signed)
    envelope = json.loads(members[1][1])
    del envelope["organisation"]
    members[1] = (members[1][0], json.dumps(envelope).encode())
    with pytest.raises(SignatureError, match="malformed.*organisation"):
        verify_and_unpack(_rewrite(signed, members), tmp_path / "out", KEYS.public_key)


def test_re_signing_replaces_only_the_signature(tmp_path: Path):
    unsigned = _unsigned(tmp_path / "u.ferry")
    sign_package(unsigned, tmp_path / "old.ferry", KEYS.private_key, SignedClaims(organisation="1"))
    sign_package(
        tmp_path / "old.ferry",
        tmp_path / "back.ferry",
        KEYS.private_key,
        SignedClaims(device_class="pi4", organisation="1"),
    )
    old, back = _members(tmp_path / "old.ferry"), _members(tmp_path / "back.ferry")
    assert [m.name for m, _ in back] == [m.name for m, _ in old]
    assert [d for _, d in back][0] == [d for _, d in old][0]
    assert [d for _, d in back][2:] == [d for _, d in old][2:]
    assert read_claims(tmp_path / "back.ferry", KEYS.public_key).claims == SignedClaims(
        device_class="pi4", organisation="1"
    )


def test_claims_check_refuses_before_any_file_is_unpacked(tmp_path: Path):
    unsigned = _unsigned(tmp_path / "u.ferry")
    sign_package(unsigned, tmp_path / "s.ferry", KEYS.private_key, SignedClaims(device_class="x86"))

    def only_pi4(verified) -> None:
        claims = verified.claims
        if not claims.matches("pi4"):
            raise PackageRejected(f"package is for device class {claims.device_class!r}, this is 'pi4'")

    with pytest.raises(PackageRejected, match="device class 'x86'"):
        verify_and_unpack(tmp_path / "s.ferry", tmp_path / "out", KEYS.public_key, check=only_pi4)
    assert not (tmp_path / "out").exists()
    assert SignedClaims(device_class="*").matches("pi4")


@pytest.mark.parametrize(
    "claims",
    [dict(organisation=3), dict(organisation="a\nb"), dict(organisation="x" * 129), dict(device_class="")],
)
def test_bad_claims_are_refused_at_signing(claims: dict):
    with pytest.raises(SignatureError):
        SignedClaims(**claims)
