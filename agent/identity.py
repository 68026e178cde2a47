"""The device's identity: enrol from a bundle, keep the key and certificate, renew before expiry.

Files in the state directory: ca.pem (pinned from the bundle, never replaced by the gateway),
device.pem (mode 0600: the key generated here, never sent anywhere, then its certificate; one
file so a renewal replaces both at once) and credential.json (mode 0600; device and
organisation ids, gateway address, the release keys the signed enrolment response named;
written last, so its presence means the enrolment is complete).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc

from agent.client import GatewayClient
from agent.errors import EnrolmentError
from agent.files import read_json, write_atomic, write_json_atomic
from deploy.proto import agent_pb2
from deploy.trust.bundle import decode_bundle
from deploy.trust.certificates import (
    BACKDATE,
    CertificateError,
    certificate_pem,
    create_csr,
    create_private_key,
    device_id_of,
    load_certificate,
    public_key_matches,
    verify_issued_by,
    verify_signature,
)

log = logging.getLogger(__name__)
RENEW_AT = 2 / 3  # of the certificate's lifetime
RELEASE_KEY_BYTES = 32
CERTIFICATE_MARKER = b"-----BEGIN CERTIFICATE-----"


@dataclass
class Identity:
    device_id: str
    organisation_id: str
    gateway: str
    release_public_keys: list[bytes]
    checkin_interval_seconds: int
    ca_pem: bytes
    key_pem: bytes
    certificate_pem: bytes

    def client(self) -> GatewayClient:
        return GatewayClient(
            self.gateway, ca_pem=self.ca_pem, key_pem=self.key_pem, certificate_pem=self.certificate_pem
        )


def _paths(state_dir: Path) -> dict[str, Path]:
    return {n: state_dir / n for n in ("ca.pem", "device.pem", "credential.json")}


def load(state_dir: Path) -> Identity | None:
    """The saved identity, or None before enrolment."""
    p = _paths(state_dir)
    saved = read_json(p["credential.json"])
    if saved is None:
        return None
    key_pem, marker, certificate = p["device.pem"].read_bytes().partition(CERTIFICATE_MARKER)
    return Identity(
        device_id=saved["device_id"],
        organisation_id=saved["organisation_id"],
        gateway=saved["gateway"],
        release_public_keys=[base64.b64decode(k) for k in saved["release_public_keys"]],
        checkin_interval_seconds=int(saved.get("checkin_interval_seconds", 30)),
        ca_pem=p["ca.pem"].read_bytes(),
        key_pem=key_pem,
        certificate_pem=marker + certificate,
    )


def enrol(bundle_text: str, state_dir: Path, name: str, attributes: agent_pb2.DeviceAttributes) -> Identity:
    """Enrol over TLS to the gateway the bundle names, trusting only the CA inside the bundle."""
    try:
        bundle = decode_bundle(bundle_text)
    except CertificateError as exc:
        raise EnrolmentError(str(exc)) from None
    key_pem = create_private_key()
    client = GatewayClient(bundle.enrol, ca_pem=bundle.ca_pem)
    try:
        reply = client.enrol(bundle.token, name, attributes, create_csr(key_pem))
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise EnrolmentError(
                f"cannot enrol at {bundle.enrol}: no TLS connection ({exc.details()}); a gateway whose "
                f"certificate is not from the pinned CA (sha256 {bundle.ca_fingerprint}) is refused"
            ) from exc
        raise EnrolmentError(f"enrolment refused: {exc.details()}") from exc
    finally:
        client.close()
    identity = accept_grant(reply, bundle.ca_pem, key_pem, bundle.gateway)
    save(state_dir, identity)
    log.info("enrolled as device %s (CA sha256 %s pinned)", identity.device_id, bundle.ca_fingerprint)
    return identity


def accept_grant(reply: agent_pb2.EnrolResponse, ca_pem: bytes, key_pem: bytes, gateway: str) -> Identity:
    """The identity an enrolment response grants, if the pinned CA signed it and it fits our key."""
    try:
        verify_signature(ca_pem, reply.grant, reply.signature)
        grant = agent_pb2.EnrolGrant.FromString(reply.grant)
        certificate = certificate_pem(grant.client_certificate)
        verify_issued_by(certificate, ca_pem)
        if not public_key_matches(certificate, key_pem):
            raise CertificateError("the certificate is not for this device's key")
        if device_id_of(certificate) != grant.device_id:
            raise CertificateError("the certificate names another device than the response")
    except (CertificateError, ValueError) as exc:
        raise EnrolmentError(f"enrolment response refused: {exc}") from None
    keys = list(grant.release_public_keys)
    if not keys or any(len(k) != RELEASE_KEY_BYTES for k in keys):
        raise EnrolmentError("enrolment response refused: it names no valid release key")
    return Identity(
        device_id=grant.device_id,
        organisation_id=grant.organisation_id,
        gateway=gateway,
        release_public_keys=keys,
        checkin_interval_seconds=grant.checkin_interval_seconds,
        ca_pem=ca_pem,
        key_pem=key_pem,
        certificate_pem=certificate,
    )


def save(state_dir: Path, identity: Identity) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    p = _paths(state_dir)
    write_atomic(p["ca.pem"], identity.ca_pem)
    write_atomic(p["device.pem"], identity.key_pem + identity.certificate_pem, mode=0o600)
    write_json_atomic(
        p["credential.json"],
        {
            "device_id": identity.device_id,
            "organisation_id": identity.organisation_id,
            "gateway": identity.gateway,
            "release_public_keys": [base64.b64encode(k).decode() for k in identity.release_public_keys],
            "checkin_interval_seconds": identity.checkin_interval_seconds,
        },
        mode=0o600,
    )


def renewal_due_in(certificate: bytes, now: datetime | None = None) -> float:
    """Seconds until the certificate reaches RENEW_AT of its lifetime (negative: overdue)."""
    cert = load_certificate(certificate)
    end = cert.not_valid_after_utc
    start = min(cert.not_valid_before_utc + BACKDATE, end)  # when it was issued (the CA backdates)
    due = start + (end - start) * RENEW_AT
    return (due - (now or datetime.now(UTC))).total_seconds()


def renew(state_dir: Path, identity: Identity, client: GatewayClient) -> Identity:
    """A new key and certificate from the gateway, saved, and the client switched to them."""
    key_pem = create_private_key()
    reply = client.renew(create_csr(key_pem))
    try:
        certificate = certificate_pem(reply.client_certificate)
        verify_issued_by(certificate, identity.ca_pem)
        if not public_key_matches(certificate, key_pem) or device_id_of(certificate) != identity.device_id:
            raise CertificateError("the renewed certificate is not for this device and key")
    except CertificateError as exc:
        raise EnrolmentError(f"renewed certificate refused: {exc}") from None
    identity.key_pem, identity.certificate_pem = key_pem, certificate
    save(state_dir, identity)
    client.use_certificate(key_pem, certificate)
    log.info("renewed the client certificate until %s", load_certificate(certificate).not_valid_after_utc)
    return identity
