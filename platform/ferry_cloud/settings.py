"""Control-plane settings, read from the environment.

With no variable set, everything is embedded (SQLite, files under var/, a SQLite
Celery broker), which is what `make demo` runs on.  Each section below scales out on
the engine it names: FERRY_DATABASE_URL (PostgreSQL), REDIS_URL (Celery broker),
FERRY_S3_BUCKET (+ FERRY_S3_ENDPOINT_URL) for package and model storage.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("FERRY_DATA_DIR", REPO_ROOT / "var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """FERRY_SECRET_KEY, or one generated once per data directory (never a constant in the source)."""
    if key := os.environ.get("FERRY_SECRET_KEY"):
        return key
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
    "rest_framework.authtoken",
    "drf_spectacular",
    "ferry_cloud",
    "accounts",
    "registry",
    "fleet",
    "releases",
    "telemetry",
    "console",
    "gateway",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

# --- Database: SQLite in var/ by default, PostgreSQL through FERRY_DATABASE_URL --------------
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("FERRY_DATABASE_URL", f"sqlite:///{DATA_DIR / 'ferry.sqlite3'}"),
        conn_max_age=int(os.environ.get("FERRY_DB_CONN_MAX_AGE", "60")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, gateway) share the file: WAL and immediate
    # transactions keep writers from failing with "database is locked".
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

# --- Storage: local files by default, S3 (boto3 via django-storages) when configured --------
MEDIA_ROOT = DATA_DIR / "media"
if os.environ.get("FERRY_S3_BUCKET"):
    _default_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": os.environ["FERRY_S3_BUCKET"],
            "endpoint_url": os.environ.get("FERRY_S3_ENDPOINT_URL") or None,
            "region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            "file_overwrite": False,
            "default_acl": None,
        },
    }
else:
    _default_storage = {"BACKEND": "django.core.files.storage.FileSystemStorage"}
STORAGES = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# --- Celery: Redis when REDIS_URL is set, otherwise a SQLite broker that needs no server -----
CELERY_BROKER_URL = os.environ.get("REDIS_URL") or f"sqla+sqlite:///{DATA_DIR / 'celery-broker.sqlite3'}"
CELERY_TASK_ACKS_LATE = True  # a crashed worker's job is redelivered; tasks are idempotent
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True  # the database row is the job's source of truth
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# `celery beat` (one per deployment) evaluates the health gates of active releases.
CELERY_BEAT_SCHEDULE = {
    "evaluate-release-gates": {
        "task": "releases.tasks.evaluate_release_gates",
        "schedule": float(os.environ.get("FERRY_GATE_INTERVAL_SECONDS", "30")),
    },
    "requeue-stale-conversions": {
        "task": "registry.tasks.requeue_stale_conversions",
        "schedule": float(os.environ.get("FERRY_REQUEUE_INTERVAL_SECONDS", "60")),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

# --- REST API -----------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "ferry_cloud.api_errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Ferry control plane API",
    "DESCRIPTION": "Models, versions, conversion jobs, releases, devices and telemetry.",
    "VERSION": "1",
}

# --- Ferry ----------------------------------------------------------------------
FERRY_RELEASE_KEY_FILE = Path(os.environ.get("FERRY_RELEASE_KEY_FILE", DATA_DIR / "keys" / "release.key"))
FERRY_GATEWAY_ADDRESS = os.environ.get("FERRY_GATEWAY_ADDRESS", "127.0.0.1:50051")
FERRY_CHECKIN_INTERVAL_SECONDS = int(os.environ.get("FERRY_CHECKIN_INTERVAL_SECONDS", "30"))
FERRY_MAX_UPLOAD_BYTES = int(os.environ.get("FERRY_MAX_UPLOAD_BYTES", str(512 << 20)))
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 << 20

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FERRY_LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}
