"""The agent's release-key set: a rotation signed by a trusted key is taken durably; anything else is
refused and changes nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.daemon import Agent
from agent.install import Installer
from agent.trust import ReleaseKeys
from deploy.errors import SignatureError
from deploy.package import generate_keypair
from deploy.proto import agent_pb2
from deploy.trust.rotation import (
    KeyRotation,
    RotationBadSignature,
    RotationMalformed,
    RotationStale,
    sign_rotation,
)

OLD, NEW, NEWER = generate_keypair(), generate_keypair(), generate_keypair()


def _signed(keys, sequence: int, signer: bytes) -> tuple[bytes, bytes]:
    return sign_rotation(KeyRotation(keys=keys, sequence=sequence, issued_at=1_800_000_000), signer)


def test_a_rotation_is_stored_atomically_and_survives_a_restart(tmp_path) -> None:
    keys = ReleaseKeys.load(tmp_path, [OLD.public_key])
    held = keys.keys  # what assignment trust holds: updated in place
    assert keys.take(*_signed((NEW.public_key,), 1, OLD.private_key)).sequence == 1
    assert held == [NEW.public_key]
    assert [p.name for p in tmp_path.iterdir()] == ["release_keys.json"]  # no temp file left
    restarted = ReleaseKeys.load(tmp_path, [OLD.public_key])
    assert (restarted.keys, restarted.sequence) == ([NEW.public_key], 1)


def test_an_older_rotation_is_refused_even_when_signed_by_a_trusted_key(tmp_path) -> None:
    keys = ReleaseKeys.load(tmp_path, [OLD.public_key])
    keys.take(*_signed((NEW.public_key,), 5, OLD.private_key))
    before = (tmp_path / "release_keys.json").read_bytes()
    with pytest.raises(RotationStale):
        keys.take(*_signed((NEWER.public_key,), 4, NEW.private_key))
    assert keys.keys == [NEW.public_key] and (tmp_path / "release_keys.json").read_bytes() == before


@pytest.mark.parametrize("content", [b"{", b"{}", b'{"keys": ["ab"], "sequence": 1, "sha256": ""}', b"[]"])
def test_a_damaged_key_file_is_an_error_not_a_fallback_to_the_enrolment_keys(tmp_path, content) -> None:
    (tmp_path / "release_keys.json").write_bytes(content)
    with pytest.raises(RotationMalformed, match="damaged"):
        ReleaseKeys.load(tmp_path, [OLD.public_key])


def test_the_daemon_logs_a_refused_rotation_and_keeps_its_keys(tmp_path, caplog) -> None:
    agent = Agent.__new__(Agent)  # only the key handling: no gateway, no enrolment
    agent.release_keys = ReleaseKeys.load(tmp_path, [OLD.public_key])
    agent.installer = type("Installer", (), {"public_key": OLD.public_key})()
    blob, signature = _signed((NEWER.public_key,), 1, NEWER.private_key)
    with caplog.at_level(logging.WARNING):
        agent.take_key_rotation(agent_pb2.KeyRotation(rotation=blob, signature=signature))
    assert "bad_signature" in caplog.text and agent.release_keys.keys == [OLD.public_key]
    assert agent.installer.public_key == OLD.public_key
    blob, signature = _signed((NEW.public_key,), 1, OLD.private_key)
    agent.take_key_rotation(agent_pb2.KeyRotation(rotation=blob, signature=signature))
    assert agent.installer.public_key == NEW.public_key and agent.release_keys.keys == [NEW.public_key]


def test_a_device_enrolled_after_a_rotation_ignores_it_quietly_without_changing_state(tmp_path) -> None:
    keys = ReleaseKeys.load(tmp_path, [NEW.public_key])  # the grant already named the new key
    assert keys.take(*_signed((NEW.public_key,), 3, OLD.private_key)) is None
    assert (keys.keys, keys.sequence) == ([NEW.public_key], 0)
    assert not (tmp_path / "release_keys.json").exists()
    # the same trick cannot smuggle in a key: other keys under an untrusted signature are refused
    with pytest.raises(RotationBadSignature):
        keys.take(*_signed((NEWER.public_key,), 4, OLD.private_key))


def test_a_package_converted_before_a_routine_rotation_still_installs(tmp_path: Path) -> None:
    from tests.agent.test_install import KEYS as CONVERSION_KEY
    from tests.agent.test_install import _offer, _signed  # signed by test_install.KEYS

    archive = _signed(tmp_path, "earlier")
    keys = ReleaseKeys.load(tmp_path, [CONVERSION_KEY.public_key])
    installer = Installer(tmp_path / "state", None, keys.keys[0], trusted_keys=keys.keys)
    rotation = KeyRotation(keys=(NEW.public_key, CONVERSION_KEY.public_key), sequence=1, issued_at=1)
    keys.take(*sign_rotation(rotation, CONVERSION_KEY.private_key))
    installer.public_key = keys.keys[0]  # as the daemon does: new packages come signed by the new key
    assert (installer.unpack(_offer("v1", archive), archive) / "weights.bin").exists()

    # After a rotation that retires the conversion key, the same package is refused.
    keys.take(*sign_rotation(KeyRotation(keys=(NEWER.public_key,), sequence=2, issued_at=1), NEW.private_key))
    installer.public_key = keys.keys[0]
    with pytest.raises(SignatureError):
        installer.unpack(_offer("v2", archive), archive)
    assert sorted(p.name for p in (tmp_path / "state" / "versions").iterdir()) == ["v1"]


def _two_retiring_rotations() -> list[tuple[bytes, bytes]]:
    """Rotations 1 and 2 with --retire-previous: OLD -> NEW -> NEWER, each signed by the key before."""
    return [_signed((NEW.public_key,), 1, OLD.private_key), _signed((NEWER.public_key,), 2, NEW.private_key)]


def test_a_device_offline_through_two_rotations_takes_the_chain_in_one_write(tmp_path) -> None:
    keys = ReleaseKeys.load(tmp_path, [OLD.public_key])
    chain = _two_retiring_rotations()
    with pytest.raises(RotationBadSignature):  # the latest alone (what a check-in carried) is signed by NEW
        keys.take(*chain[1])
    assert [r.sequence for r in keys.take_chain(chain)] == [1, 2]
    assert (keys.keys, keys.sequence, keys.reported_sequence) == ([NEWER.public_key], 2, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["release_keys.json"]
    restarted = ReleaseKeys.load(tmp_path, [OLD.public_key])
    assert (restarted.keys, restarted.sequence) == ([NEWER.public_key], 2)
    assert restarted.take_chain(chain[1:]) == []  # the last one taken, sent again: nothing to do


def test_a_chain_with_a_bad_link_changes_nothing_not_even_its_good_links(tmp_path) -> None:
    keys = ReleaseKeys.load(tmp_path, [OLD.public_key])
    first, _ = _two_retiring_rotations()
    forged = _signed((NEWER.public_key,), 2, NEWER.private_key)
    with pytest.raises(RotationBadSignature, match="link 2 of 2"):
        keys.take_chain([first, forged])
    assert (keys.keys, keys.sequence) == ([OLD.public_key], 0)
    assert not (tmp_path / "release_keys.json").exists()


def test_a_device_enrolled_after_rotations_recognises_its_keys_and_follows_later_ones(tmp_path) -> None:
    chain = _two_retiring_rotations()
    keys = ReleaseKeys.load(tmp_path, [NEW.public_key])  # enrolled between rotation 1 and 2
    assert [r.sequence for r in keys.take_chain(chain)] == [2]  # 1 names its keys; 2 is signed by NEW
    assert (keys.keys, keys.sequence) == ([NEWER.public_key], 2)
    late = ReleaseKeys.load(tmp_path / "late", [NEWER.public_key])  # enrolled after both
    assert late.take_chain(chain) == [] and late.reported_sequence == 2 and late.sequence == 0
    assert not (tmp_path / "late" / "release_keys.json").exists()


def test_the_daemon_follows_a_chain_and_logs_the_control_planes_refusal_code(tmp_path, caplog) -> None:
    agent = Agent.__new__(Agent)
    agent.release_keys = ReleaseKeys.load(tmp_path, [OLD.public_key])
    agent.installer = type("Installer", (), {"public_key": OLD.public_key})()
    first, second = _two_retiring_rotations()
    behind = agent_pb2.CheckInResponse(key_rotation_refused="reenrol_required")
    behind.key_rotation_chain.add(rotation=second[0], signature=second[1])  # rotation 1 left out
    with caplog.at_level(logging.WARNING):
        agent.take_key_rotations(behind)
    assert "bad_signature" in caplog.text and "reenrol_required" in caplog.text
    assert agent.release_keys.keys == [OLD.public_key]
    reply = agent_pb2.CheckInResponse()
    for blob, signature in (first, second):
        reply.key_rotation_chain.add(rotation=blob, signature=signature)
    agent.take_key_rotations(reply)
    assert agent.installer.public_key == NEWER.public_key and agent.release_keys.sequence == 2
