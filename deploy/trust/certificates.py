"""The device channel's PKI: one EC P-256 CA per control plane, a server certificate for the
gateway, and short-lived client certificates for devices, issued from a CSR whose key never
leaves the device.

A device's identity is its certificate's SAN URI ``ferry:device:<device id>`` (the CN holds
the same id for people reading logs); the gateway reads it from the TLS peer, never from a
message.  Everything here is pure: PEM or DER bytes in, PEM or DER bytes out.
"""

from __future__ import annotations

import hashlib
import ipaddress
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from deploy.errors import DeployError

DEVICE_URI_PREFIX = "ferry:device:"
DEFAULT_CLIENT_LIFETIME = timedelta(hours=24)
DEFAULT_CA_LIFETIME = timedelta(days=3650)
DEFAULT_SERVER_LIFETIME = timedelta(days=397)
# Clocks of devices drift: a certificate is valid from a little before it was issued.
BACKDATE = timedelta(minutes=5)
MAX_CSR_BYTES = 4096


class CertificateError(DeployError):
    """A certificate, key, CSR or signature is malformed, expired or made by another CA."""


@dataclass(frozen=True)
class KeyPair:
    """A private key and its certificate, both PEM."""

    key_pem: bytes
    certificate_pem: bytes


@dataclass(frozen=True)
class IssuedCertificate:
    certificate_pem: bytes
    serial: str  # hex
    not_after: datetime


def _now() -> datetime:
    return datetime.now(UTC)


def create_private_key() -> bytes:
    """A new P-256 private key, PEM (PKCS#8, unencrypted: the file's mode protects it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_private_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"not a PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError("expected an EC private key")
    return key


def load_certificate(data: bytes) -> x509.Certificate:
    """A certificate from PEM or DER bytes."""
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise CertificateError(f"not an X.509 certificate: {exc}") from None


def certificate_der(data: bytes) -> bytes:
    return load_certificate(data).public_bytes(serialization.Encoding.DER)


def certificate_pem(data: bytes) -> bytes:
    return load_certificate(data).public_bytes(serialization.Encoding.PEM)


def fingerprint(data: bytes) -> str:
    """sha256 of the certificate's DER, hex: what an operator compares."""
    return hashlib.sha256(certificate_der(data)).hexdigest()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _serial() -> int:
    return x509.random_serial_number()


def create_ca(common_name: str = "Ferry device CA", lifetime: timedelta = DEFAULT_CA_LIFETIME) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_key_pem(key), certificate.public_bytes(serialization.Encoding.PEM))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _leaf(
    ca: KeyPair,
    *,
    subject: x509.Name,
    public_key,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    lifetime: timedelta,
    now: datetime,
) -> x509.Certificate:
    ca_key = load_private_key(ca.key_pem)
    ca_cert = load_certificate(ca.certificate_pem)
    if ca_cert.public_key().public_numbers() != ca_key.public_key().public_numbers():
        raise CertificateError("the CA key does not belong to the CA certificate")
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(_serial())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + lifetime, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def create_server_certificate(
    ca: KeyPair,
    *,
    dns_names: list[str] = (),
    ip_addresses: list[str] = (),
    lifetime: timedelta = DEFAULT_SERVER_LIFETIME,
) -> KeyPair:
    """The gateway's certificate; agents check the address they dial against its SANs."""
    if not dns_names and not ip_addresses:
        raise CertificateError("a server certificate needs at least one DNS name or IP address")
    try:
        sans = [x509.DNSName(n) for n in dns_names] + [
            x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses
        ]
    except ValueError as exc:
        raise CertificateError(f"bad server name or address: {exc}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name((list(dns_names) or list(ip_addresses))[0])
    certificate = _leaf(
        ca,
        subject=subject,
        public_key=key.public_key(),
        sans=sans,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        lifetime=lifetime,
        now=_now(),
    )
    return KeyPair(_key_pem(key), certificate.public_bytes(serialization.Encoding.PEM))


def create_csr(key_pem: bytes, common_name: str = "ferry-device") -> bytes:
    """A CSR (DER) for the device's own key; the CA ignores its subject and sets the identity."""
    key = load_private_key(key_pem)
    csr = x509.CertificateSigningRequestBuilder().subject_name(_name(common_name)).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.DER)


def load_csr(der: bytes) -> x509.CertificateSigningRequest:
    """A CSR from DER, its self-signature checked (the requester holds the key)."""
    if not der:
        raise CertificateError("no CSR: the device sends one made from its own key")
    if len(der) > MAX_CSR_BYTES:
        raise CertificateError(f"the CSR is {len(der)} bytes; at most {MAX_CSR_BYTES}")
    try:
        csr = x509.load_der_x509_csr(der)
    except ValueError as exc:
        raise CertificateError(f"not a DER certificate signing request: {exc}") from None
    if not csr.is_signature_valid:
        raise CertificateError("the CSR's signature does not match its key")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise CertificateError("the CSR's key must be EC P-256")
    return csr


def device_uri(device_id: str) -> str:
    return f"{DEVICE_URI_PREFIX}{device_id}"


def sign_client_certificate(
    ca: KeyPair,
    csr_der: bytes,
    *,
    device_id: str,
    lifetime: timedelta = DEFAULT_CLIENT_LIFETIME,
    now: datetime | None = None,
) -> IssuedCertificate:
    """A client certificate for the CSR's key naming device_id (SAN URI and CN), whatever the CSR asked."""
    csr = load_csr(csr_der)
    certificate = _leaf(
        ca,
        subject=_name(device_id),
        public_key=csr.public_key(),
        sans=[x509.UniformResourceIdentifier(device_uri(device_id))],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        lifetime=lifetime,
        now=now or _now(),
    )
    return IssuedCertificate(
        certificate_pem=certificate.public_bytes(serialization.Encoding.PEM),
        serial=format(certificate.serial_number, "x"),
        not_after=certificate.not_valid_after_utc,
    )


def device_id_of(data: bytes) -> str:
    """The device id a client certificate names (its SAN URI); CertificateError if none."""
    return device_id_from_uris(_uris(load_certificate(data)))


def device_id_from_uris(uris: list[str]) -> str:
    ids = [u[len(DEVICE_URI_PREFIX) :] for u in uris if u.startswith(DEVICE_URI_PREFIX)]
    if len(ids) != 1:
        raise CertificateError(f"expected exactly one {DEVICE_URI_PREFIX}<id> SAN, found {len(ids)}")
    try:
        return str(uuid.UUID(ids[0]))
    except ValueError:
        raise CertificateError(f"the device id {ids[0]!r} is not a UUID") from None


def _uris(certificate: x509.Certificate) -> list[str]:
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return sans.get_values_for_type(x509.UniformResourceIdentifier)


def verify_issued_by(data: bytes, ca_certificate: bytes, *, now: datetime | None = None) -> x509.Certificate:
    """The certificate, if the CA signed it and it is valid now; CertificateError otherwise."""
    certificate = load_certificate(data)
    ca = load_certificate(ca_certificate)
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError("the certificate was not issued by the pinned CA") from None
    moment = now or _now()
    if not certificate.not_valid_before_utc <= moment <= certificate.not_valid_after_utc:
        raise CertificateError(
            f"the certificate is not valid now (valid until {certificate.not_valid_after_utc})"
        )
    return certificate


def public_key_matches(data: bytes, key_pem: bytes) -> bool:
    """Whether the certificate is for this private key."""
    cert_key = load_certificate(data).public_key()
    return cert_key.public_numbers() == load_private_key(key_pem).public_key().public_numbers()


def sign(key_pem: bytes, data: bytes) -> bytes:
    """An ECDSA-SHA256 signature (DER) of data with the CA key: how the enrolment response is signed."""
    return load_private_key(key_pem).sign(data, ec.ECDSA(hashes.SHA256()))


def verify_signature(ca_certificate: bytes, data: bytes, signature: bytes) -> None:
    """CertificateError unless signature is the CA key's signature of data."""
    key = load_certificate(ca_certificate).public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise CertificateError("the pinned CA's key is not an EC key")
    try:
        key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise CertificateError("the enrolment response is not signed by the pinned CA") from None
