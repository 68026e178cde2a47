"""Paths, the secret key and Django's core: apps, middleware, templates."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DATA_DIR = Path(os.environ.get("FERRY_DATA_DIR", REPO_ROOT / "var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """FERRY_SECRET_KEY, or one generated once per data directory (never a constant in the source)."""
    if key := os.environ.get("FERRY_SECRET_KEY"):
        return key
    if os.environ.get("FERRY_ENV", "").strip().lower() == "production":
        return ""  # security.py refuses to start without FERRY_SECRET_KEY; write no file for it
    path = DATA_DIR / "secret_key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


# --- Django core -------------------------------------------------------------
SECRET_KEY = _secret_key()
DEBUG = os.environ.get("FERRY_DEBUG_WEB", "") == "1"
ALLOWED_HOSTS = os.environ.get("FERRY_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver").split(",")
ROOT_URLCONF = "ferry_cloud.urls"
WSGI_APPLICATION = "ferry_cloud.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en"
STATIC_URL = "static/"
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:dashboard"
LOGOUT_REDIRECT_URL = "console:login"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here: the docs work offline
    "django_prometheus",
    "ferry_cloud",
    "accounts",
    "registry",
    "fleet",
    "releases",
    "telemetry",
    "webhooks",
    "console",
    "gateway",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first: times everything below
    "ferry_cloud.observability.middleware.RequestLogMiddleware",  # request id, one log line a request
    "ferry_cloud.throttling.RateLimitHeadersMiddleware",  # RateLimit-* on every throttled answer
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, before anything else reads the request
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.csp.ContentSecurityPolicyMiddleware",  # pages load scripts from this origin only
    "django_prometheus.middleware.PrometheusAfterMiddleware",  # last: sees the view and the status
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
