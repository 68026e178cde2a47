"""The gateway's TLS: server credentials for its two ports, and the device a TLS peer is.

grpc's Python server either requires a client certificate (verified against the CA) or does
not ask for one at all: there is no "ask, but let enrolment through". So the gateway listens
twice: the mutual-TLS port for every device call, and an enrolment port with server-only TLS
where only Enrol can succeed (a call there has no peer identity, so _device refuses it).
"""

from __future__ import annotations

import grpc
from django.conf import settings
from ferry_cloud.device_ca import device_ca_certificate, gateway_server_certificate

from deploy.trust.certificates import CertificateError, device_id_from_uris

SAN_KEY = "x509_subject_alternative_name"
# SAN URIs -> the device id they name (None: none): parsed once per certificate, not per call
_DEVICE_IDS: dict[tuple[bytes, ...], str | None] = {}
_DEVICE_IDS_MAX = 100_000


def server_credentials(*, require_client_certificate: bool) -> grpc.ServerCredentials:
    server = gateway_server_certificate()
    return grpc.ssl_server_credentials(
        [(server.key_pem, server.certificate_pem)],
        root_certificates=device_ca_certificate() if require_client_certificate else None,
        require_client_auth=require_client_certificate,
    )


def enrol_address_for(address: str) -> str:
    """FERRY_GATEWAY_ENROL_ADDRESS, else the same host on the next port (any free port for port 0)."""
    if settings.FERRY_GATEWAY_ENROL_ADDRESS:
        return settings.FERRY_GATEWAY_ENROL_ADDRESS
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + 1 if int(port) else 0}"


def peer_device_id(context: grpc.ServicerContext) -> str | None:
    """The device id in the verified client certificate's SAN URI; None without one.

    grpc fills the auth context only after it verified the certificate against the CA, so
    what is read here was signed by the control plane."""
    sans = tuple(context.auth_context().get(SAN_KEY, ()))
    if not sans:
        return None
    try:
        return _DEVICE_IDS[sans]
    except KeyError:
        pass
    try:
        device_id = device_id_from_uris([value.decode() for value in sans])
    except CertificateError:
        device_id = None
    if len(_DEVICE_IDS) >= _DEVICE_IDS_MAX:
        _DEVICE_IDS.clear()  # simplest bound: a full cache starts over
    _DEVICE_IDS[sans] = device_id
    return device_id
