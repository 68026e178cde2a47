"""The installer's steps, as the update lifecycle calls them: verify and unpack, switch the pointer
atomically, health-check, switch back. With real packages and files."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

import engine.format
from agent.errors import ActivationError, DownloadError
from agent.inference import InferenceLoop
from agent.install import Installer, Offer, health_check, package_check
from deploy.errors import IntegrityError, SignatureError
from deploy.package import SignedClaims, digest, file_sha256, generate_keypair, sign_package
from tests.agent.double import ORGANISATION_ID
from tests.agent.packages import convert_classifier

KEYS = generate_keypair()


def _signed(tmp_path: Path, name: str, *, seed: int = 0, break_selftest: bool = False) -> Path:
    unsigned = convert_classifier(tmp_path / f"{name}.unsigned", seed, break_selftest=break_selftest)
    signed = tmp_path / f"{name}.ferry"
    sign_package(unsigned, signed, KEYS.private_key, SignedClaims(organisation=ORGANISATION_ID))
    return signed


def _offer(version_id: str, archive: Path) -> Offer:
    return Offer("release", version_id, version_id, "m", file_sha256(archive), archive.stat().st_size)


def _stage(installer: Installer, version_id: str, archive: Path) -> Path:
    offer = _offer(version_id, archive)
    return installer.unpack(offer, archive)


def test_switch_moves_the_pointer_and_keeps_the_previous_version(tmp_path: Path):
    installer = Installer(tmp_path / "state", client=None, public_key=KEYS.public_key)
    health_check(_stage(installer, "v1", _signed(tmp_path, "one")))
    installer.switch_to("v1")
    assert installer.current_version() == "v1"
    _stage(installer, "v2", _signed(tmp_path, "two", seed=1))
    installer.switch_to("v2")
    assert installer.current_version() == "v2"
    assert os.readlink(tmp_path / "state" / "previous") == "versions/v1"
    assert (tmp_path / "state" / "versions" / "v1" / "weights.bin").exists()


def test_failed_health_check_and_switch_back_to_the_running_version(tmp_path: Path):
    installer = Installer(tmp_path / "state", client=None, public_key=KEYS.public_key)
    _stage(installer, "v1", _signed(tmp_path, "good"))
    installer.switch_to("v1")
    bad = _stage(installer, "v2", _signed(tmp_path, "bad", break_selftest=True))
    installer.switch_to("v2")
    with pytest.raises(ActivationError, match="self-test output"):
        health_check(bad)
    installer.switch_back("v1")
    assert installer.current_version() == "v1"
    assert installer.previous_version() == "v1"  # switch_back leaves `previous` alone


def test_package_signed_by_another_key_never_reaches_versions(tmp_path: Path):
    installer = Installer(tmp_path / "state", client=None, public_key=generate_keypair().public_key)
    archive = _signed(tmp_path, "one")
    with pytest.raises(SignatureError):
        installer.unpack(_offer("v1", archive), archive)
    assert list((tmp_path / "state" / "versions").iterdir()) == []
    assert installer.current_version() == ""


def test_a_slow_download_stops_keeps_its_part_and_resumes(tmp_path: Path):
    from agent.errors import DownloadStalled
    from agent.install import DownloadRules
    from tests.agent.double import GatewayDouble, device_client, serve

    archive = _signed(tmp_path, "one")
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    try:
        double.publish(archive, "v1", hint=False)
        double.chunk_bytes, double.chunk_delay = 1024, 0.05  # about 20 KB/s
        client = device_client(port)
        slow_rules = DownloadRules(min_bytes_per_second=1 << 20, speed_window_seconds=0.2, reserve_bytes=0)
        installer = Installer(tmp_path / "state", client, KEYS.public_key, slow_rules)
        offer = _offer("v1", archive)
        with pytest.raises(DownloadStalled, match="too slow"):
            installer.download(offer)
        kept = installer.part_file(offer).stat().st_size
        assert 0 < kept < offer.package_size
        double.chunk_delay = 0.0
        installer.rules = DownloadRules(reserve_bytes=0)
        assert installer.download(offer).read_bytes() == archive.read_bytes()
        assert double.download_offsets == [0, kept]  # resumed, not restarted
    finally:
        server.stop(grace=None)


class HashedBytes:
    """Counts the bytes given to the package library's one sha256 (deploy.package.digest)."""

    def __init__(self) -> None:
        self.total = 0
        self._sha256 = digest.sha256

    def sha256(self, data: bytes = b"") -> digest.Digest:
        counter = self

        class Counting:
            def __init__(self) -> None:
                self._inner = counter._sha256()
                self.update(data)

            def update(self, block: bytes) -> None:
                counter.total += len(block)
                self._inner.update(block)

            def hexdigest(self) -> str:
                return self._inner.hexdigest()

        return Counting()


def test_one_activation_hashes_each_byte_of_the_package_once(tmp_path: Path, monkeypatch):
    """Download, verify and unpack, health check, then the inference loop's load: the archive
    is hashed once (it must be the assigned one), the manifest and every file once while
    unpacking; the engine's loads of the unpacked directory hash nothing."""
    from agent.install import DownloadRules
    from tests.agent.double import GatewayDouble, device_client, manifest_sha256, serve

    archive = _signed(tmp_path, "one")
    hashed = HashedBytes()
    monkeypatch.setattr(digest, "sha256", hashed.sha256)
    engine_hashes: list[object] = []
    real_engine_sha256 = engine.format._sha256
    monkeypatch.setattr(
        engine.format, "_sha256", lambda loc: engine_hashes.append(loc) or real_engine_sha256(loc)
    )
    double = GatewayDouble(KEYS)
    server, port = serve(double)
    loop = InferenceLoop()
    loop.start()
    try:
        double.publish(archive, "v1", hint=False)
        client = device_client(port)
        installer = Installer(tmp_path / "state", client, KEYS.public_key, DownloadRules(reserve_bytes=0))
        offer = _offer("v1", archive)
        assigned = manifest_sha256(archive)
        hashed.total = 0  # what making the offer took is not the device's
        part = installer.download(offer)
        check = package_check(device_class="pi4", organisation_id=ORGANISATION_ID, manifest_sha256=assigned)
        directory = installer.unpack(offer, part, check=check)
        health_check(directory)
        loop.load(directory, "v1")
    finally:
        loop.stop()
        server.stop(grace=None)
    unpacked = {p.name: p.stat().st_size for p in directory.iterdir()}
    assert sorted(unpacked) == ["graph.json", "manifest.json", "weights.bin"]
    # each byte at most twice: the archive's digest (the assignment names it), then each file as
    # it unpacks; the engine never hashes it again
    assert hashed.total == archive.stat().st_size + sum(unpacked.values())
    assert engine_hashes == []


def test_a_refused_archive_that_is_not_the_offered_one_is_a_download_error(tmp_path: Path):
    """An archive that is not the assigned one (its digest) is refused before it is unpacked:
    bytes damaged on the way are the download's fault (retried later), the file deleted."""
    installer = Installer(tmp_path / "state", client=None, public_key=KEYS.public_key)
    archive = _signed(tmp_path, "one")
    offer = _offer("v1", archive)
    data = bytearray(archive.read_bytes())
    with tarfile.open(archive) as tar:
        weights = tar.getmember("weights.bin")
    data[weights.offset_data + weights.size - 1] ^= 0x01
    damaged = tmp_path / "damaged.ferry"
    damaged.write_bytes(bytes(data))
    with pytest.raises(DownloadError, match="arrived with the wrong size or digest"):
        installer.unpack(offer, damaged)
    assert not damaged.exists()
    assert not installer.staging_dir(offer).exists()
    # the same bytes offered under their own digest are a bad package, refused for good
    damaged.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="weights.bin does not match the sha256 and size"):
        installer.unpack(_offer("v1", damaged), damaged)
