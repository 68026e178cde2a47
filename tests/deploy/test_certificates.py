"""The device channel's PKI and enrolment bundles: what is issued names the right device, and
what is forged, expired, cut short or hostile is refused with a clear error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deploy.trust import certificates as c
from deploy.trust.bundle import PREFIX, BundleError, EnrolmentBundle, decode_bundle, encode_bundle

DEVICE = "6f1c2a34-1111-2222-3333-444455556666"
CA = c.create_ca("test CA")


def test_a_csr_becomes_a_short_lived_client_certificate_naming_only_the_device():
    key = c.create_private_key()
    issued = c.sign_client_certificate(CA, c.create_csr(key, common_name="someone-else"), device_id=DEVICE)
    cert = c.verify_issued_by(issued.certificate_pem, CA.certificate_pem)
    assert c.device_id_of(issued.certificate_pem) == DEVICE
    assert cert.subject.rfc4514_string() == f"CN={DEVICE}"  # the CSR's subject is ignored
    assert c.public_key_matches(issued.certificate_pem, key)
    lifetime = issued.not_after - datetime.now(UTC)
    assert timedelta(hours=23, minutes=59) < lifetime <= timedelta(hours=24)
    assert issued.serial == format(cert.serial_number, "x")


def test_certificates_of_another_ca_or_out_of_date_are_refused():
    key = c.create_private_key()
    other = c.create_ca("other")
    forged = c.sign_client_certificate(other, c.create_csr(key), device_id=DEVICE)
    with pytest.raises(c.CertificateError, match="pinned CA"):
        c.verify_issued_by(forged.certificate_pem, CA.certificate_pem)
    issued = c.sign_client_certificate(CA, c.create_csr(key), device_id=DEVICE, lifetime=timedelta(hours=1))
    later = datetime.now(UTC) + timedelta(hours=2)
    with pytest.raises(c.CertificateError, match="not valid now"):
        c.verify_issued_by(issued.certificate_pem, CA.certificate_pem, now=later)
    with pytest.raises(c.CertificateError, match="does not belong"):
        c.sign_client_certificate(
            c.KeyPair(other.key_pem, CA.certificate_pem), c.create_csr(key), device_id=DEVICE
        )


def test_server_certificate_names_and_fingerprints():
    server = c.create_server_certificate(CA, dns_names=["gw.example"], ip_addresses=["10.0.0.1", "::1"])
    c.verify_issued_by(server.certificate_pem, CA.certificate_pem)
    assert len(c.fingerprint(server.certificate_pem)) == 64
    assert c.fingerprint(server.certificate_pem) == c.fingerprint(c.certificate_der(server.certificate_pem))
    with pytest.raises(c.CertificateError, match="at least one"):
        c.create_server_certificate(CA)
    with pytest.raises(c.CertificateError, match="bad server name"):
        c.create_server_certificate(CA, ip_addresses=["not-an-ip"])


def test_signatures_bind_bytes_to_the_ca_key():
    signature = c.sign(CA.key_pem, b"grant")
    c.verify_signature(CA.certificate_pem, b"grant", signature)
    with pytest.raises(c.CertificateError, match="not signed"):
        c.verify_signature(CA.certificate_pem, b"grant!", signature)
    with pytest.raises(c.CertificateError, match="not signed"):
        c.verify_signature(c.create_ca("x").certificate_pem, b"grant", signature)


@given(st.binary(max_size=600))
def test_hostile_csrs_and_certificates_are_refused_cleanly(data):
    with pytest.raises(c.CertificateError):
        c.sign_client_certificate(CA, data, device_id=DEVICE)
    with pytest.raises(c.CertificateError):
        c.load_certificate(data)


def test_a_csr_too_big_or_not_p256_is_refused():
    with pytest.raises(c.CertificateError, match="at most"):
        c.load_csr(b"\x30" * (c.MAX_CSR_BYTES + 1))
    with pytest.raises(c.CertificateError, match="no CSR"):
        c.load_csr(b"")


def test_a_bundle_round_trips_and_pins_the_ca():
    bundle = EnrolmentBundle(gateway="gw:50051", enrol="gw:50052", token="fet_abc", ca_pem=CA.certificate_pem)
    line = encode_bundle(bundle)
    assert line.startswith(PREFIX) and "\n" not in line and len(line) < 1500
    decoded = decode_bundle(f"  {line}\n")
    assert decoded == bundle and decoded.ca_fingerprint == c.fingerprint(CA.certificate_pem)


@given(st.text(max_size=300))
def test_hostile_bundles_are_refused_with_a_bundle_error(text):
    with pytest.raises(BundleError):
        decode_bundle(text if not text.startswith(PREFIX) else text + "!")


def test_a_bundle_cut_short_says_so():
    line = encode_bundle(EnrolmentBundle("gw:1", "gw:2", "fet_x", CA.certificate_pem))
    with pytest.raises(BundleError, match="damaged|not an X.509"):
        decode_bundle(line[: len(line) // 2])
