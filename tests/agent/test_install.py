"""The installer's steps, as the update lifecycle calls them: verify and unpack, switch the pointer
atomically, health-check, switch back. With real packages and files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import ActivationError
from agent.install import Installer, Offer, health_check
from deploy.errors import SignatureError
from deploy.signing import file_sha256, generate_keypair, sign_package
from tests.agent.packages import convert_classifier

KEYS = generate_keypair()


def _signed(tmp_path: Path, name: str, *, seed: int = 0, break_selftest: bool = False) -> Path:
    unsigned = convert_classifier(tmp_path / f"{name}.unsigned", seed, break_selftest=break_selftest)
    signed = tmp_path / f"{name}.ferry"
    sign_package(unsigned, signed, KEYS.private_key)
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
    from agent.client import GatewayClient
    from agent.errors import DownloadStalled
    from agent.install import DownloadRules
    from tests.agent.double import GatewayDouble, serve

    archive = _signed(tmp_path, "one")
    double = GatewayDouble(KEYS.public_key)
    server, port = serve(double)
    try:
        double.publish(archive, "v1", hint=False)
        double.chunk_bytes, double.chunk_delay = 1024, 0.05  # about 20 KB/s
        client = GatewayClient(f"127.0.0.1:{port}", credential="device-1.secret")
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
