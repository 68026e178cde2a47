"""Release-key rotation over the real gateway: `manage.py release_key rotate`, the rotation in
CheckInResponse, and the agent's key set taking it (or refusing a forged one)."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from ferry_cloud.release_key import release_public_key
from releases.services import release_create

from agent.daemon import offer_from
from agent.trust import AssignmentTrust, ReleaseKeys
from deploy.package import generate_keypair
from deploy.trust.assignment import AssignmentBadSignature, verify_assignment
from deploy.trust.rotation import KeyRotation, RotationBadSignature, sign_rotation
from tests.platform.gateway.test_gateway import ATTRS, _enrolled, gateway  # noqa: F401


@pytest.fixture
def own_release_key(settings, tmp_path):
    settings.FERRY_RELEASE_KEY_FILE = str(tmp_path / "keys" / "release.key")
    return tmp_path / "keys"


def test_after_a_rotation_the_device_takes_the_new_key_and_refuses_a_forged_rotation(
    org,
    admin,
    ready_version,
    gateway,  # noqa: F811
    own_release_key,
    tmp_path,
    capsys,
):
    client, reply = _enrolled(org, gateway)
    old_key = release_public_key()
    assert list(reply.release_public_keys) == [old_key]
    state = tmp_path / "agent"
    state.mkdir()
    keys = ReleaseKeys.load(state, list(reply.release_public_keys))
    trust = AssignmentTrust(state, keys.keys, reply.device_id, reply.organisation_id)
    release_create(
        organisation=org,
        version=ready_version,
        name="before-rotation",
        target={"labels": {"fleet": "demo"}},
        actor=admin[0],
        start=True,
    )
    before = client.check_in(ATTRS, "", "")
    assert not before.HasField("key_rotation")  # never rotated: nothing sent
    first = trust.accept(offer_from(before.desired))

    call_command("release_key", "rotate", "--retire-previous")  # as after a leak: old key dropped
    assert "rotation 1" in capsys.readouterr().out
    new_key = release_public_key()
    assert new_key != old_key and (own_release_key / "release.key.1.retired").exists()

    # Nothing changed in the fleet, yet the stored assignment is reissued under the new key.
    response = client.check_in(ATTRS, "", "")
    rotation = keys.take(response.key_rotation.rotation, response.key_rotation.signature)
    assert rotation is not None and rotation.keys == (new_key,) and keys.keys == [new_key]
    accepted = trust.accept(offer_from(response.desired))  # the trust holds the same, rotated list
    assert accepted.version_id == str(ready_version.pk) and accepted.counter > first.counter
    with pytest.raises(AssignmentBadSignature):  # signed by the new key, not the old one
        verify_assignment(
            response.desired.assignment,
            response.desired.assignment_signature,
            [old_key],
            device_id=reply.device_id,
            organisation_id=reply.organisation_id,
            last_counter=0,
            now=time.time(),
        )
    again = client.check_in(ATTRS, "", "")
    assert keys.take(again.key_rotation.rotation, again.key_rotation.signature) is None  # already taken

    # An attacker (or whoever stole the retired key) forges the next rotation: refused, keys kept.
    attacker = generate_keypair()
    retired = (own_release_key / "release.key.1.retired").read_bytes()
    for signer in (attacker.private_key, retired):
        forged = KeyRotation(keys=(attacker.public_key,), sequence=2, issued_at=int(time.time()))
        with pytest.raises(RotationBadSignature):
            keys.take(*sign_rotation(forged, signer))
    assert keys.keys == [new_key] and keys.sequence == 1

    # A restarted agent trusts the rotated set, not the enrolment grant's.
    restarted = ReleaseKeys.load(state, list(reply.release_public_keys))
    assert (restarted.keys, restarted.sequence) == ([new_key], 1)

    # A routine rotation is signed by the key trusted now and keeps it in the set (packages
    # converted under it stay installable); the device follows it too.
    call_command("release_key", "rotate")
    third = client.check_in(ATTRS, str(ready_version.pk), ready_version.package.sha256)
    taken = restarted.take(third.key_rotation.rotation, third.key_rotation.signature)
    assert taken is not None and taken.sequence == 2
    assert restarted.keys == [release_public_key(), new_key]

    # A device enrolled now is granted that same set (so the rotation verifies: it holds the
    # signing key) and taking the rotation changes none of its keys.
    _, late = _enrolled(org, gateway)
    assert list(late.release_public_keys) == restarted.keys
    late_keys = ReleaseKeys.load(tmp_path, list(late.release_public_keys))
    late_keys.take(third.key_rotation.rotation, third.key_rotation.signature)
    assert (late_keys.keys, late_keys.sequence) == (restarted.keys, 2)
