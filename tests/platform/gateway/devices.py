"""The real gateway served for a test, and devices enrolled with it the way the agent does:
a key made here, a CSR, the signed response checked against the control plane's CA."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ferry_cloud.device_ca import device_ca_certificate
from fleet.services import enrolment_token_create
from gateway.hints import HintHub
from gateway.server import build_server

from agent.client import GatewayClient
from agent.identity import Identity, accept_grant
from deploy.proto import agent_pb2
from deploy.trust.certificates import create_csr, create_private_key

ATTRS = agent_pb2.DeviceAttributes(hardware="pi4", os="linux", agent_version="test", labels={"fleet": "demo"})


@dataclass(frozen=True)
class Served:
    address: str  # mutual TLS
    enrol_address: str  # server TLS only

    def enrol_client(self) -> GatewayClient:
        """A client with no certificate: all it can do is enrol."""
        return GatewayClient(self.enrol_address, ca_pem=device_ca_certificate())


@contextmanager
def served(*, workers: int = 4, hub: HintHub | None = None) -> Iterator[Served]:
    server, port = bound = build_server("127.0.0.1:0", workers=workers, hub=hub)
    server.start()
    try:
        yield Served(f"127.0.0.1:{port}", f"127.0.0.1:{bound.enrol_port}")
    finally:
        server.stop(grace=None)


def enrol(
    gateway: Served, org, name: str = "dev-1", labels: dict[str, str] | None = None, token: str = ""
) -> tuple[GatewayClient, Identity]:
    """A device of org, enrolled over TLS, and a client holding its certificate."""
    token = token or enrolment_token_create(organisation=org, labels=labels or {}).token
    key = create_private_key()
    enroller = gateway.enrol_client()
    try:
        reply = enroller.enrol(token, name, ATTRS, create_csr(key))
    finally:
        enroller.close()
    identity = accept_grant(reply, device_ca_certificate(), key, gateway.address)
    return identity.client(), identity
