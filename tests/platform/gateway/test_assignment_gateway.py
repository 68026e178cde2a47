"""Signed per-device assignments at the gateway: what a device is offered, when a new
assignment (a higher counter) is issued, and which packages a device may download."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from ferry_cloud.release_key import release_public_key
from fleet.models import Device
from fleet.services import device_pin
from releases.models import DeviceAssignment
from releases.services import release_create, release_transition

from deploy.trust.assignment import verify_assignment
from tests.platform.gateway.test_gateway import ATTRS, _enrolled, gateway  # noqa: F401
from tests.platform.releases.test_rollout_api import second_version  # noqa: F401


def _verified(reply, offer, last_counter: int = 0):
    return verify_assignment(
        offer.assignment,
        offer.assignment_signature,
        list(reply.release_public_keys),
        device_id=reply.device_id,
        organisation_id=reply.organisation_id,
        last_counter=last_counter,
        now=time.time(),
    )


def test_assignments_are_reused_until_something_changes_then_only_go_up(
    org,
    admin,
    ready_version,
    second_version,  # noqa: F811
    gateway,  # noqa: F811
):
    client, reply = _enrolled(org, gateway)
    assert reply.organisation_id == str(org.pk) and list(reply.release_public_keys) == [release_public_key()]
    release_create(
        organisation=org,
        version=ready_version,
        name="v1",
        target={"labels": {"fleet": "demo"}},
        actor=admin[0],
        start=True,
    )
    first = client.check_in(ATTRS, "", "").desired
    v1 = _verified(reply, first)
    assert (v1.version_id, v1.package_digest, v1.package_size) == (
        str(ready_version.pk),
        ready_version.package.sha256,
        ready_version.package.size,
    )
    assert v1.expires_at - v1.issued_at == 7 * 24 * 3600 and not v1.rollback
    again = client.check_in(ATTRS, str(ready_version.pk), ready_version.package.sha256).desired
    assert again.assignment == first.assignment  # nothing changed: the same signed bytes

    v2_release = release_create(
        organisation=org,
        version=second_version,
        name="v2",
        target={"labels": {"fleet": "demo"}},
        actor=admin[0],
        start=True,
    )
    v2 = _verified(reply, client.check_in(ATTRS, str(ready_version.pk), "").desired, v1.counter)
    assert v2.version_id == str(second_version.pk) and v2.counter > v1.counter

    device = Device.objects.get(pk=reply.device_id)
    device_pin(device=device, version_id=ready_version.pk)
    pinned = _verified(reply, client.check_in(ATTRS, str(second_version.pk), "").desired, v2.counter)
    assert (pinned.version_id, pinned.release_id) == (str(ready_version.pk), "")
    device_pin(device=Device.objects.get(pk=reply.device_id), version_id=None)
    unpinned = _verified(reply, client.check_in(ATTRS, str(ready_version.pk), "").desired, pinned.counter)
    assert unpinned.version_id == str(second_version.pk)

    release_transition(release_id=v2_release.pk, action="abort", actor=admin[0], reason="bad")
    back = _verified(reply, client.check_in(ATTRS, str(second_version.pk), "").desired, unpinned.counter)
    assert back.rollback and back.version_id == str(ready_version.pk)
    assert back.package_digest == ready_version.package.sha256  # the same package, never re-signed

    # an assignment past half its lifetime is renewed at the next check-in, with a higher counter
    DeviceAssignment.objects.filter(device_id=device.pk).update(
        expires_at=DeviceAssignment.objects.get(device_id=device.pk).issued_at
    )
    renewed = _verified(reply, client.check_in(ATTRS, str(ready_version.pk), "").desired, back.counter)
    assert renewed.counter > back.counter and renewed.version_id == back.version_id

    # a database restored from a backup forgets the assignment row: the counter still goes up
    DeviceAssignment.objects.filter(device_id=device.pk).delete()
    restored = _verified(reply, client.check_in(ATTRS, str(ready_version.pk), "").desired, renewed.counter)
    assert restored.counter > renewed.counter


def test_a_device_downloads_only_packages_assigned_to_it(org, admin, ready_version, gateway):  # noqa: F811
    client, reply = _enrolled(org, gateway)
    other, _ = _enrolled(org, gateway)
    release_create(
        organisation=org,
        version=ready_version,
        name="v1",
        target={"device_ids": [reply.device_id]},
        actor=admin[0],
        start=True,
    )
    offer = client.check_in(ATTRS, "", "").desired
    assert json.loads(offer.assignment)["package_digest"] == ready_version.package.sha256
    assert b"".join(c.data for c in client.download(ready_version.package.sha256, 0, 30))
    # another device of the same organisation, never assigned it; a package nobody assigned
    for who, digest in ((other, ready_version.package.sha256), (client, "f" * 64)):
        with pytest.raises(grpc.RpcError) as refused:
            list(who.download(digest, 0, 30))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert digest in refused.value.details()


def test_a_check_in_with_nothing_changed_costs_one_query_more(org, admin, ready_version, gateway):  # noqa: F811
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from releases.assignments import assignment_for
    from releases.selectors import desired_package_for

    _, reply = _enrolled(org, gateway)
    release_create(
        organisation=org,
        version=ready_version,
        name="v1",
        target={"labels": {"fleet": "demo"}},
        actor=admin[0],
        start=True,
    )
    device = Device.objects.get(pk=reply.device_id)
    first = assignment_for(device)  # issues it
    with CaptureQueriesContext(connection) as deciding:
        desired_package_for(device)
    with CaptureQueriesContext(connection) as reusing:
        again = assignment_for(device)
    assert (again.blob, again.counter) == (first.blob, first.counter)
    assert len(reusing) == len(deciding) + 1
