"""What the gRPC gateway offers a checking-in agent under the rollout policies: download-only,
maintenance windows, pins, and rollbacks after an abort (a newer signed assignment of the
very same package)."""

from __future__ import annotations

import json

from releases.services import release_create, release_transition

from deploy.proto import agent_pb2
from tests.platform.gateway.test_gateway import ATTRS, _enrolled, gateway  # noqa: F401
from tests.platform.releases.test_rollout_api import second_version  # noqa: F401


def test_offer_carries_download_only_window_and_rollback(org, admin, ready_version, second_version, gateway):  # noqa: F811
    client, _ = _enrolled(org, gateway)
    client.check_in(ATTRS, str(ready_version.pk), ready_version.package.sha256)  # it runs v1
    window = {"cron": "0 3 * * 0", "duration_seconds": 7200, "timezone": "Europe/Berlin"}
    release = release_create(
        organisation=org,
        version=second_version,
        name="v2 pre-staged",
        target={"labels": {"fleet": "demo"}},
        download_only=True,
        window=window,
        actor=admin[0],
        start=True,
    )
    offer = client.check_in(ATTRS, str(ready_version.pk), "").desired
    assert offer.version_id == str(second_version.pk) and offer.download_only and not offer.rollback
    assert offer.window == agent_pb2.MaintenanceWindow(**window)

    release_transition(release_id=release.pk, action="activate", actor=admin[0])
    offer = client.check_in(ATTRS, str(ready_version.pk), "").desired
    assert not offer.download_only and not json.loads(offer.assignment)["download_only"]
    v2_counter = json.loads(offer.assignment)["counter"]

    client.check_in(ATTRS, str(second_version.pk), second_version.package.sha256)  # it installed v2
    release_transition(release_id=release.pk, action="abort", actor=admin[0], reason="bad model")
    offer = client.check_in(ATTRS, str(second_version.pk), "").desired
    assert offer.rollback and offer.version_id == str(ready_version.pk)
    # the previous version's own package, in an assignment with a counter above v2's
    assert offer.package_digest == ready_version.package.sha256
    back = json.loads(offer.assignment)
    assert back["rollback"] and back["version_id"] == str(ready_version.pk) and back["counter"] > v2_counter

    client.check_in(ATTRS, str(ready_version.pk), offer.package_digest)  # it went back
    assert not client.check_in(ATTRS, str(ready_version.pk), "").HasField("desired")
