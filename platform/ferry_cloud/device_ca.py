"""The control plane's device CA and the gateway's server certificate, as files named by settings
(FERRY_DEVICE_CA_* and FERRY_GATEWAY_TLS_*).

Outside production the first process that needs them generates a dev CA and a server
certificate under DATA_DIR/pki, atomically (like the release key); `manage.py demo` and the
test stacks call ensure_device_pki() before starting processes, so they never race. In
production nothing is generated: a missing file stops the gateway with a message naming it.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from deploy.trust.certificates import KeyPair, create_ca, create_server_certificate


def ensure_device_pki() -> None:
    """Generate the dev CA and server certificate if they are missing and generation is allowed."""
    if not settings.FERRY_DEVICE_PKI_GENERATE:
        return
    ensure_pki_files(
        ca_cert=Path(settings.FERRY_DEVICE_CA_CERT_FILE),
        ca_key=Path(settings.FERRY_DEVICE_CA_KEY_FILE),
        server_cert=Path(settings.FERRY_GATEWAY_TLS_CERT_FILE),
        server_key=Path(settings.FERRY_GATEWAY_TLS_KEY_FILE),
        names=settings.FERRY_GATEWAY_TLS_NAMES,
    )


def ensure_pki_files(
    *, ca_cert: Path, ca_key: Path, server_cert: Path, server_key: Path, names: list[str]
) -> None:
    """A dev CA and a server certificate for names at these paths, unless they exist already."""
    if not ca_cert.exists():
        ca = create_ca("Ferry dev device CA")
        _write_once(ca_key, ca.key_pem)
        _write_once(ca_cert, ca.certificate_pem)
    if not server_cert.exists():
        ca = KeyPair(key_pem=ca_key.read_bytes(), certificate_pem=ca_cert.read_bytes())
        server = create_server_certificate(
            ca,
            dns_names=[n for n in names if not _is_ip(n)],
            ip_addresses=[n.strip("[]") for n in names if _is_ip(n)],
        )
        _write_once(server_key, server.key_pem)
        _write_once(server_cert, server.certificate_pem)


def device_ca() -> KeyPair:
    """The CA that signs device certificates and enrolment responses."""
    ensure_device_pki()
    return KeyPair(
        key_pem=_read(settings.FERRY_DEVICE_CA_KEY_FILE, "FERRY_DEVICE_CA_KEY_FILE"),
        certificate_pem=_read(settings.FERRY_DEVICE_CA_CERT_FILE, "FERRY_DEVICE_CA_CERT_FILE"),
    )


def gateway_server_certificate() -> KeyPair:
    ensure_device_pki()
    return KeyPair(
        key_pem=_read(settings.FERRY_GATEWAY_TLS_KEY_FILE, "FERRY_GATEWAY_TLS_KEY_FILE"),
        certificate_pem=_read(settings.FERRY_GATEWAY_TLS_CERT_FILE, "FERRY_GATEWAY_TLS_CERT_FILE"),
    )


def device_ca_certificate() -> bytes:
    """The CA certificate alone (PEM): what enrolment bundles carry."""
    ensure_device_pki()
    return _read(settings.FERRY_DEVICE_CA_CERT_FILE, "FERRY_DEVICE_CA_CERT_FILE")


def _read(path, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"{setting}={path}: cannot read it ({exc.strerror}); production needs its own device CA "
            "and gateway certificate (see ferry_cloud/settings/security.py)"
        ) from None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _write_once(path: Path, data: bytes) -> None:
    """Write data at path unless another process already has; keys are readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
