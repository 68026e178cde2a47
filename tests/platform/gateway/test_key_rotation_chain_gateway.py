"""Rotation chains over the real gateway: a device reports the rotation it holds and is sent every
rotation above it (at most MAX_CHAIN, else a reenrol_required code), and the device row and its
REST view show who is behind."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from ferry_cloud.release_key import release_public_key
from fleet.models import Device

from agent.trust import ReleaseKeys
from deploy.trust.rotation import MAX_CHAIN
from ferryctl.fleet import DEVICE_COLUMNS
from tests.platform.gateway.test_gateway import ATTRS, _enrolled, gateway  # noqa: F401


@pytest.fixture
def own_release_key(settings, tmp_path):
    settings.FERRY_RELEASE_KEY_FILE = str(tmp_path / "keys" / "release.key")
    return tmp_path / "keys"


def _links(response) -> list[tuple[bytes, bytes]]:
    return [(link.rotation, link.signature) for link in response.key_rotation_chain]


def test_a_device_behind_by_two_retiring_rotations_is_sent_both_and_catches_up(
    org,
    gateway,  # noqa: F811
    own_release_key,
    tmp_path,
    api,
):
    client, reply = _enrolled(org, gateway)
    keys = ReleaseKeys.load(tmp_path, list(reply.release_public_keys))
    assert not client.check_in(ATTRS, "", "").key_rotation_chain  # never rotated: nothing sent
    call_command("release_key", "rotate", "--retire-previous")
    call_command("release_key", "rotate", "--retire-previous")

    behind = client.check_in(ATTRS, "", "", key_rotation_sequence=0)
    assert len(behind.key_rotation_chain) == 2 and not behind.key_rotation_refused
    assert (behind.key_rotation.rotation, behind.key_rotation.signature) == _links(behind)[-1]
    device = Device.objects.get(pk=reply.device_id)
    assert device.release_key_sequence == 0
    row = api.get(f"/api/v1/devices/{device.pk}/").json()
    assert (row["release_key_sequence"], row["release_key_status"]) == (0, "behind")
    assert dict(DEVICE_COLUMNS)["KEYS"](row) == "0 behind"  # `ferryctl devices list` shows it

    assert [r.sequence for r in keys.take_chain(_links(behind))] == [1, 2]
    assert keys.keys == [release_public_key()]
    caught_up = client.check_in(ATTRS, "", "", key_rotation_sequence=keys.reported_sequence)
    assert not caught_up.key_rotation_chain and caught_up.HasField("key_rotation")  # latest, for old agents
    device.refresh_from_db()
    assert device.release_key_sequence == 2
    listed = api.get("/api/v1/devices/").json()["results"]
    assert [(d["release_key_sequence"], d["release_key_status"]) for d in listed] == [(2, "current")]

    one_behind = client.check_in(ATTRS, "", "", key_rotation_sequence=1)
    assert len(one_behind.key_rotation_chain) == 1


def test_a_device_further_behind_than_a_chain_is_told_to_enrol_again(
    org,
    gateway,  # noqa: F811
    own_release_key,
    api,
    capsys,
):
    client, reply = _enrolled(org, gateway)
    for _ in range(MAX_CHAIN + 1):
        call_command("release_key", "rotate", "--retire-previous")
    assert "1 device(s) hold a rotation more than 16 behind" in capsys.readouterr().out
    response = client.check_in(ATTRS, "", "", key_rotation_sequence=0)
    assert response.key_rotation_refused == "reenrol_required"
    # the latest MAX_CHAIN links are sent anyway: a device enrolled after them finds its own keys
    assert len(response.key_rotation_chain) == MAX_CHAIN
    row = api.get(f"/api/v1/devices/{reply.device_id}/").json()
    assert row["release_key_status"] == "reenrol_required"
    assert not client.check_in(ATTRS, "", "", key_rotation_sequence=1).key_rotation_refused
