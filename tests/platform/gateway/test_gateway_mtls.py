"""The device channel against an attacker on the network, a stolen or forged certificate, a
replayed token, a gateway of another CA, and a revoked device: the real gateway on loopback
ports, called over real TLS."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
from ferry_cloud.device_ca import device_ca, device_ca_certificate
from fleet.models import Device, EnrolmentToken
from fleet.services import device_revoke, enrolment_bundle, enrolment_token_create
from gateway.hints import HintHub
from gateway.servicer import AgentGatewayServicer
from telemetry.models import TelemetryRecord

from agent import identity
from agent.client import GatewayClient
from agent.errors import EnrolmentError
from agent.outbox import OutboxRecord
from deploy.proto import agent_pb2, agent_pb2_grpc
from deploy.trust import certificates
from deploy.trust.bundle import decode_bundle
from tests.platform.gateway.devices import ATTRS, enrol, served


@pytest.fixture
def hub():
    hub = HintHub(poll_seconds=0.2)
    yield hub
    hub.stop()


@pytest.fixture
def gateway(transactional_db, hub):
    with served(hub=hub) as gateway:
        yield gateway


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        result = call()
        if not isinstance(
            result, agent_pb2.CheckInResponse | agent_pb2.TelemetryAck | agent_pb2.RenewResponse
        ):
            next(iter(result))
    return refused.value.code()


def _every_device_call(client: GatewayClient) -> dict[str, callable]:
    return {
        "CheckIn": lambda: client.check_in(ATTRS, "", ""),
        "ReportTelemetry": lambda: client.report([OutboxRecord(1, "metrics", 1.7e9, "", {"x": 1})]),
        "DownloadPackage": lambda: client.download("0" * 64, 0, 5),
        "WatchHints": lambda: client.watch("", timeout=5),
        "Renew": lambda: client.renew(certificates.create_csr(certificates.create_private_key())),
    }


def test_plaintext_clients_are_refused_on_both_ports(org, gateway):
    for address in (gateway.address, gateway.enrol_address):
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentGatewayStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Enrol(agent_pb2.EnrolRequest(token="x"), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_without_a_client_certificate_only_enrol_works(org, gateway):
    anonymous = gateway.enrol_client()
    for method, call in _every_device_call(anonymous).items():
        assert _code(call) == grpc.StatusCode.UNAUTHENTICATED, method
    # the mutual-TLS port does not even finish the handshake without a certificate
    no_cert = GatewayClient(gateway.address, ca_pem=device_ca_certificate())
    assert _code(lambda: no_cert.check_in(ATTRS, "", "")) == grpc.StatusCode.UNAVAILABLE
    client, device = enrol(gateway, org)  # and Enrol itself works there
    assert client.check_in(ATTRS, "", "").checkin_interval_seconds > 0
    assert Device.objects.get(pk=device.device_id).certificate_serial


def test_a_certificate_acts_only_as_its_own_device(org, gateway):
    alice, a = enrol(gateway, org, name="a")
    _, b = enrol(gateway, org, name="b")
    alice.report([OutboxRecord(1, "metrics", 1.7e9, "", {"x": 1})])
    assert TelemetryRecord.objects.filter(device_id=a.device_id).count() == 1
    assert not TelemetryRecord.objects.filter(device_id=b.device_id).exists()
    # a certificate naming b, signed by anyone but the control plane's CA, is refused in the handshake
    rogue_ca = certificates.create_ca("rogue")
    key = certificates.create_private_key()
    forged = certificates.sign_client_certificate(
        rogue_ca, certificates.create_csr(key), device_id=b.device_id
    )
    mallory = GatewayClient(
        gateway.address, ca_pem=device_ca_certificate(), key_pem=key, certificate_pem=forged.certificate_pem
    )
    assert _code(lambda: mallory.check_in(ATTRS, "", "")) == grpc.StatusCode.UNAVAILABLE
    # and b's certificate without b's key is useless: TLS proves possession of the key
    stolen_cert_only = GatewayClient(
        gateway.address, ca_pem=device_ca_certificate(), key_pem=key, certificate_pem=b.certificate_pem
    )
    assert _code(lambda: stolen_cert_only.check_in(ATTRS, "", "")) == grpc.StatusCode.UNAVAILABLE


def test_a_replayed_or_bad_enrolment_is_refused_and_loses_nothing(org, gateway):
    token = enrolment_token_create(organisation=org).token
    anonymous = gateway.enrol_client()
    with pytest.raises(grpc.RpcError) as bad_csr:
        anonymous.enrol(token, "x", ATTRS, b"not a csr")
    assert bad_csr.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert EnrolmentToken.objects.get().used_at is None  # a bad CSR does not spend the token
    enrol(gateway, org, token=token)
    with pytest.raises(grpc.RpcError) as replayed:
        anonymous.enrol(token, "y", ATTRS, certificates.create_csr(certificates.create_private_key()))
    assert replayed.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert Device.objects.filter(organisation=org).count() == 1


def test_an_agent_refuses_a_gateway_of_another_ca(org, transactional_db, tmp_path):
    """A man in the middle with a certificate from its own CA, in front of a real servicer."""
    rogue_ca = certificates.create_ca("mitm")
    rogue = certificates.create_server_certificate(rogue_ca, ip_addresses=["127.0.0.1"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(AgentGatewayServicer(HintHub()), server)
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.ssl_server_credentials([(rogue.key_pem, rogue.certificate_pem)])
    )
    server.start()
    try:
        token = enrolment_token_create(organisation=org).token
        bundle = enrolment_bundle(
            token=token, gateway_address=f"127.0.0.1:{port}", enrol_address=f"127.0.0.1:{port}"
        )
        with pytest.raises(EnrolmentError, match="pinned CA"):
            identity.enrol(bundle, tmp_path / "agent", "victim", ATTRS)
        assert EnrolmentToken.objects.get().used_at is None  # the token never reached anyone
        assert not (tmp_path / "agent" / "credential.json").exists()
    finally:
        server.stop(grace=None)


def test_an_enrolment_response_not_signed_by_the_pinned_ca_is_refused(org, gateway):
    key = certificates.create_private_key()
    token = enrolment_token_create(organisation=org).token
    reply = gateway.enrol_client().enrol(token, "d", ATTRS, certificates.create_csr(key))
    grant = agent_pb2.EnrolGrant.FromString(reply.grant)
    grant.release_public_keys[:] = [b"\x01" * 32]  # an attacker's release key
    tampered = agent_pb2.EnrolResponse(grant=grant.SerializeToString(), signature=reply.signature)
    with pytest.raises(EnrolmentError, match="not signed by the pinned CA"):
        identity.accept_grant(tampered, device_ca_certificate(), key, gateway.address)
    other_ca = certificates.create_ca("other")
    with pytest.raises(EnrolmentError, match="not signed by the pinned CA"):
        identity.accept_grant(reply, other_ca.certificate_pem, key, gateway.address)
    accepted = identity.accept_grant(reply, device_ca_certificate(), key, gateway.address)
    assert accepted.device_id == grant.device_id and accepted.organisation_id == str(org.pk)


def _open_stream(client: GatewayClient) -> tuple[threading.Event, list]:
    ended, codes = threading.Event(), []
    stream = client.watch("", timeout=60)

    def read() -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError as exc:
            codes.append(exc.code())
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    return ended, codes


def _wait(predicate, seconds: float = 10.0) -> bool:
    event = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return True
        event.wait(0.05)
    return False


def test_revocation_closes_the_stream_and_refuses_every_call_and_renewal(org, gateway, hub):
    client, device = enrol(gateway, org)
    ended, codes = _open_stream(client)
    assert _wait(lambda: hub.watchers == 1)
    device_revoke(device=Device.objects.get(pk=device.device_id))
    assert ended.wait(10), "the revoked device's hint stream stayed open"
    assert codes == [grpc.StatusCode.PERMISSION_DENIED]
    for method, call in _every_device_call(client).items():
        assert _code(call) == grpc.StatusCode.PERMISSION_DENIED, method
    assert hub.watchers == 0


def test_a_second_hint_stream_replaces_the_first(org, gateway, hub):
    client, _ = enrol(gateway, org)
    first_ended, first_codes = _open_stream(client)
    assert _wait(lambda: hub.watchers == 1)
    second_ended, _ = _open_stream(client)
    assert first_ended.wait(10), "the first stream was not closed"
    assert first_codes == [grpc.StatusCode.ABORTED]
    assert not second_ended.is_set()
    assert _wait(lambda: hub.watchers == 1)
    other, _ = enrol(gateway, org, name="other")  # another device's stream is its own
    _open_stream(other)
    assert _wait(lambda: hub.watchers == 2) and not second_ended.is_set()


def test_renewal_issues_a_fresh_certificate_for_a_new_key(org, gateway, tmp_path):
    client, device = enrol(gateway, org)
    before = Device.objects.get(pk=device.device_id).certificate_serial
    renewed = identity.renew(tmp_path, device, client)
    record = Device.objects.get(pk=device.device_id)
    assert record.certificate_serial != before and record.certificate_expires_at is not None
    assert certificates.device_id_of(renewed.certificate_pem) == device.device_id
    assert certificates.public_key_matches(renewed.certificate_pem, renewed.key_pem)
    assert client.check_in(ATTRS, "", "").checkin_interval_seconds > 0  # the client switched
    assert identity.load(tmp_path).certificate_pem == renewed.certificate_pem
    assert 0 < identity.renewal_due_in(renewed.certificate_pem) <= 16 * 3600


def test_the_ca_key_signs_only_what_the_ca_certificate_names():
    ca = device_ca()
    assert certificates.fingerprint(ca.certificate_pem) == certificates.fingerprint(device_ca_certificate())


def test_an_operator_pastes_the_apis_bundle_and_the_device_joins(api, org, gateway, settings, tmp_path):
    """The REST API's token comes with its bundle once the gateway's public addresses are set."""
    assert api.post("/api/v1/enrolment-tokens/", {}, format="json").json()["bundle"] == ""
    settings.FERRY_GATEWAY_PUBLIC_ADDRESS = gateway.address
    settings.FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS = gateway.enrol_address
    body = api.post("/api/v1/enrolment-tokens/", {"labels": {"site": "lab"}}, format="json").json()
    bundle = decode_bundle(body["bundle"])
    assert bundle.token == body["token"] and bundle.ca_pem == device_ca_certificate()
    device = identity.enrol(body["bundle"], tmp_path / "agent", "pasted", ATTRS)
    client = identity.load(tmp_path / "agent").client()
    assert client.check_in(ATTRS, "", "").checkin_interval_seconds > 0
    assert Device.objects.get(pk=device.device_id).labels["site"] == "lab"
