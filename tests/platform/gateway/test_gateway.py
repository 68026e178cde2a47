"""The gRPC gateway, served for real on a loopback port and called with the agent's own client."""

from __future__ import annotations

import grpc
import pytest
from ferry_cloud.release_key import release_public_key
from fleet.models import Device
from fleet.services import device_revoke, enrolment_token_create
from releases.services import release_create
from telemetry.models import TelemetryRecord

from agent.client import GatewayClient
from agent.identity import Identity
from agent.outbox import OutboxRecord
from deploy.package import verify_and_unpack
from deploy.trust.certificates import create_csr, create_private_key
from tests.platform.gateway.devices import ATTRS, Served, enrol, served


@pytest.fixture
def gateway(transactional_db):
    with served() as gateway:
        yield gateway


def _enrolled(org, gateway: Served) -> tuple[GatewayClient, Identity]:
    return enrol(gateway, org, labels={"site": "lab"})


def test_enrol_check_in_download_and_verify(org, admin, ready_version, gateway, tmp_path):
    client, reply = _enrolled(org, gateway)
    assert reply.release_public_keys == [release_public_key()]
    device = Device.objects.get(pk=reply.device_id)
    assert device.labels == {"fleet": "demo", "site": "lab"}

    assert not client.check_in(ATTRS, "", "").HasField("desired")  # nothing released yet
    release_create(
        organisation=org,
        version=ready_version,
        name="r",
        target={"labels": {"fleet": "demo"}},
        actor=admin[0],
        start=True,
    )
    offer = client.check_in(ATTRS, "", "").desired
    assert offer.version_id == str(ready_version.pk)
    assert offer.package_digest == ready_version.package.sha256

    # a download broken after the first chunk resumes from where it stopped
    archive = tmp_path / "pkg.ferry"
    first = next(iter(client.download(offer.package_digest, 0, 30)))
    archive.write_bytes(first.data)
    with open(archive, "ab") as f:
        for chunk in client.download(offer.package_digest, len(first.data), 30):
            assert chunk.offset == archive.stat().st_size
            f.write(chunk.data)
            f.flush()
    assert archive.stat().st_size == offer.package_size
    verified = verify_and_unpack(archive, tmp_path / "out", reply.release_public_keys[0])
    assert verified.manifest["outputs"][0]["name"] == "probabilities"

    client.check_in(ATTRS, offer.version_id, offer.package_digest)
    device.refresh_from_db()
    assert device.running_version_id == ready_version.pk


def test_enrolment_token_is_single_use(org, gateway):
    token = enrolment_token_create(organisation=org).token
    enrol(gateway, org, token=token)
    with pytest.raises(grpc.RpcError) as refused:  # replayed, from another connection
        gateway.enrol_client().enrol(token, "b", ATTRS, create_csr(create_private_key()))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "already been used" in refused.value.details()
    assert Device.objects.filter(organisation=org).count() == 1


def test_a_revoked_device_is_refused(org, gateway):
    client, reply = _enrolled(org, gateway)
    client.check_in(ATTRS, "", "")
    device_revoke(device=Device.objects.get(pk=reply.device_id))
    with pytest.raises(grpc.RpcError) as revoked:
        client.check_in(ATTRS, "", "")
    assert revoked.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "revoked" in revoked.value.details()


def test_telemetry_is_stored_exactly_once_when_batches_are_replayed(org, gateway):
    client, reply = _enrolled(org, gateway)
    records = [OutboxRecord(seq, "metrics", 1.7e9 + seq, "", {"inferences": seq}) for seq in range(1, 51)]
    first = client.report(records[:30])
    assert list(first.stored_seqs) == list(range(1, 31)) and not first.duplicate_seqs
    replay = client.report(records)  # the first 30 again, as after a lost ack
    assert list(replay.duplicate_seqs) == list(range(1, 31))
    assert list(replay.stored_seqs) == list(range(31, 51))
    stored = TelemetryRecord.objects.filter(device_id=reply.device_id)
    assert stored.count() == 50
    assert sorted(stored.values_list("seq", flat=True)) == list(range(1, 51))


def test_a_package_never_assigned_to_the_device_is_refused(org, gateway):
    client, _ = _enrolled(org, gateway)
    with pytest.raises(grpc.RpcError) as refused:
        list(client.download("0" * 64, 0, 10))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "0" * 64 in refused.value.details() and "never assigned" in refused.value.details()
