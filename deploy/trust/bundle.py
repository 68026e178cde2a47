"""The enrolment bundle: one copy-paste line with everything a device needs to join safely.

``ferry-enrol-1:<base64url JSON>`` holding the gateway's mutual-TLS address, its enrolment
address, the one-time token, and the CA certificate itself (DER, base64url).  The CA travels
inside the line rather than as a fingerprint plus a fetch: a P-256 CA is ~500 bytes, so the
device pins it with no extra round trip and nothing to trust on first use.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from deploy.trust.certificates import CertificateError, certificate_der, certificate_pem, fingerprint

PREFIX = "ferry-enrol-1:"
MAX_BUNDLE_CHARS = 8192


class BundleError(CertificateError):
    """The enrolment bundle is not one Ferry made, or was cut short when copied."""


@dataclass(frozen=True)
class EnrolmentBundle:
    gateway: str  # host:port of the mutual-TLS port
    enrol: str  # host:port of the enrolment (server-authenticated TLS) port
    token: str
    ca_pem: bytes

    @property
    def ca_fingerprint(self) -> str:
        return fingerprint(self.ca_pem)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_bundle(bundle: EnrolmentBundle) -> str:
    body = {
        "gateway": bundle.gateway,
        "enrol": bundle.enrol,
        "token": bundle.token,
        "ca": _b64(certificate_der(bundle.ca_pem)),
    }
    return PREFIX + _b64(json.dumps(body, separators=(",", ":")).encode())


def _address(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > 255 or ":" not in value:
        raise BundleError(f"the enrolment bundle's {key!r} must be host:port")
    return value


def decode_bundle(text: str) -> EnrolmentBundle:
    text = text.strip()
    if not text.startswith(PREFIX):
        raise BundleError(f"an enrolment bundle starts with {PREFIX!r}; copy the whole line")
    if len(text) > MAX_BUNDLE_CHARS:
        raise BundleError(f"the enrolment bundle is longer than {MAX_BUNDLE_CHARS} characters")
    try:
        body = json.loads(_unb64(text[len(PREFIX) :]))
        ca_der = _unb64(body["ca"])
    except (ValueError, binascii.Error, KeyError, TypeError):
        raise BundleError("the enrolment bundle is damaged (was it cut short when copied?)") from None
    if not isinstance(body, dict) or not isinstance(body.get("token"), str) or not body["token"]:
        raise BundleError("the enrolment bundle holds no token")
    return EnrolmentBundle(
        gateway=_address(body, "gateway"),
        enrol=_address(body, "enrol"),
        token=body["token"],
        ca_pem=certificate_pem(ca_der),
    )
