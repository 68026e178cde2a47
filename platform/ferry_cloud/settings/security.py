"""Production switch and the web settings it hardens: secret key, hosts, cookies, HTTPS.

FERRY_ENV=production is the explicit switch (docker/compose.yaml sets it). Without it the
settings stay as `make demo` and the tests need them: a secret key generated once per data
directory (base.py), plain-HTTP cookies, loopback hosts. With it, a missing or weak
FERRY_SECRET_KEY, or the debug page switched on, stop every process at start with an
ImproperlyConfigured that names the variable, rather than running insecurely.

Imported after base.py by the package's __init__, so ALLOWED_HOSTS here replaces base's.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from .base import DATA_DIR

_ENVIRONMENTS = ("development", "production")

FERRY_ENV = os.environ.get("FERRY_ENV", "development").strip().lower() or "development"
if FERRY_ENV not in _ENVIRONMENTS:
    # A typo such as "prod" must not silently fall back to the development defaults.
    raise ImproperlyConfigured(f"FERRY_ENV={FERRY_ENV!r}: expected one of {', '.join(_ENVIRONMENTS)}")
PRODUCTION = FERRY_ENV == "production"

# Django's own check (security.W009) wants 50 characters with at least 5 distinct ones.
_MIN_SECRET_KEY_LENGTH = 50


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={value!r}: expected 1 or 0")


def _seconds(name: str) -> int:
    value = os.environ.get(name, "").strip() or "0"
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name}={value!r}: expected a whole number of seconds")
    return int(value)


def _hosts(value: str) -> list[str]:
    return [host.strip() for host in value.split(",") if host.strip()]


if PRODUCTION:
    # base.py already read FERRY_SECRET_KEY when it is set; what is left is refusing to
    # start on a per-data-dir generated key, which differs between replicas and hosts.
    _key = os.environ.get("FERRY_SECRET_KEY", "")
    if not _key:
        raise ImproperlyConfigured(
            "FERRY_SECRET_KEY is required when FERRY_ENV=production (one value shared by every "
            "web, gateway and worker process), e.g. "
            'python -c "import secrets; print(secrets.token_urlsafe(50))"'
        )
    if len(_key) < _MIN_SECRET_KEY_LENGTH or len(set(_key)) < 5:
        raise ImproperlyConfigured(
            f"FERRY_SECRET_KEY is too weak for FERRY_ENV=production: use at least "
            f"{_MIN_SECRET_KEY_LENGTH} random characters"
        )
    if os.environ.get("FERRY_DEBUG_WEB", "") == "1":
        raise ImproperlyConfigured("FERRY_DEBUG_WEB=1 is refused when FERRY_ENV=production")

# Loopback names by default; production drops the test client's "testserver".
ALLOWED_HOSTS = _hosts(
    os.environ.get(
        "FERRY_ALLOWED_HOSTS",
        "127.0.0.1,localhost,[::1]" if PRODUCTION else "127.0.0.1,localhost,[::1],testserver",
    )
)
CSRF_TRUSTED_ORIGINS = _hosts(os.environ.get("FERRY_CSRF_TRUSTED_ORIGINS", ""))

# --- Cookies: never readable by scripts; HTTPS-only in production ---------------------------
# The demo and the browser tests use plain http://127.0.0.1, where a Secure cookie would never
# come back; FERRY_SECURE_COOKIES overrides either way (e.g. 0 behind a plain-HTTP test proxy).
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _flag("FERRY_SECURE_COOKIES", PRODUCTION)
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # the console's forms carry the token in a hidden field
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"

# --- HTTPS behind a proxy: opt-in, since trusting the header without a proxy that sets it
# lets any client claim HTTPS --------------------------------------------------------------
if _flag("FERRY_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = _flag("FERRY_SSL_REDIRECT", False)
# Container and load-balancer probes speak plain HTTP to the process itself.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
# HSTS is opt-in: once a browser has it, the host cannot go back to HTTP for that long.
SECURE_HSTS_SECONDS = _seconds("FERRY_HSTS_SECONDS")
SECURE_HSTS_INCLUDE_SUBDOMAINS = _flag("FERRY_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = _flag("FERRY_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# --- The device channel's PKI (deploy/trust/certificates.py, ferry_cloud/device_ca.py) ------
# The gateway serves TLS only: devices dial FERRY_GATEWAY_ADDRESS with their client
# certificate (mutual TLS) and FERRY_GATEWAY_ENROL_ADDRESS to enrol (server TLS only; empty:
# the same host, the next port). Outside production a dev CA and a server certificate for
# FERRY_GATEWAY_TLS_NAMES are generated once under DATA_DIR/pki. In production nothing is
# generated: point these four files at your own CA (its key signs device certificates and
# enrolment responses, so keep it to the gateway's hosts) and a server certificate it issued
# for the names devices dial.
_PKI_DIR = Path(os.environ.get("FERRY_PKI_DIR", DATA_DIR / "pki"))
FERRY_DEVICE_CA_CERT_FILE = Path(os.environ.get("FERRY_DEVICE_CA_CERT_FILE", _PKI_DIR / "ca.pem"))
FERRY_DEVICE_CA_KEY_FILE = Path(os.environ.get("FERRY_DEVICE_CA_KEY_FILE", _PKI_DIR / "ca.key"))
FERRY_GATEWAY_TLS_CERT_FILE = Path(os.environ.get("FERRY_GATEWAY_TLS_CERT_FILE", _PKI_DIR / "gateway.pem"))
FERRY_GATEWAY_TLS_KEY_FILE = Path(os.environ.get("FERRY_GATEWAY_TLS_KEY_FILE", _PKI_DIR / "gateway.key"))
# SANs of the generated dev server certificate (names and IP addresses, comma-separated).
FERRY_GATEWAY_TLS_NAMES = _hosts(os.environ.get("FERRY_GATEWAY_TLS_NAMES", "localhost,127.0.0.1,::1"))
FERRY_GATEWAY_ENROL_ADDRESS = os.environ.get("FERRY_GATEWAY_ENROL_ADDRESS", "")
# What devices dial (host:port of the mutual-TLS and the enrolment port): when set, a new
# enrolment token comes with its one-line bundle (POST /api/v1/enrolment-tokens/).
FERRY_GATEWAY_PUBLIC_ADDRESS = os.environ.get("FERRY_GATEWAY_PUBLIC_ADDRESS", "")
FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS = os.environ.get("FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS", "")
# Lifetime of a device's client certificate; agents renew at two thirds of it.
FERRY_DEVICE_CERT_HOURS = float(os.environ.get("FERRY_DEVICE_CERT_HOURS", "24") or 24)
FERRY_DEVICE_PKI_GENERATE = not PRODUCTION
