"""The REST API (DRF) and its OpenAPI document (drf-spectacular)."""

from __future__ import annotations

import os

# --- REST API -----------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "ferry_cloud.api_errors.exception_handler",
    # JSON bodies only; the one file upload declares multipart itself (registry/api.py).
    "DEFAULT_PARSER_CLASSES": ["ferry_cloud.api_parsers.BoundedJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    # Per API token, per IP address when anonymous (ferry_cloud/throttling.py); counted in CACHES.
    "DEFAULT_THROTTLE_CLASSES": ["ferry_cloud.throttling.ApiRateThrottle"],
    # Proxies in front whose X-Forwarded-For names the client (0: the peer's address is the client's).
    "NUM_PROXIES": int(os.environ.get("FERRY_API_TRUSTED_PROXIES", "0") or 0),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Ferry control plane API",
    "DESCRIPTION": "Models, versions, conversion jobs, releases, devices and telemetry.",
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",  # null as a type: generated clients and validators read it alike
    # request and response components apart: an upload's file is binary only in the request
    "COMPONENT_SPLIT_REQUEST": True,
    # fields of the same name with different choices ("kind", "status"): each enum keeps a
    # stable name of its own, so a generated client's types don't change with the order of views
    "ENUM_NAME_OVERRIDES": {
        "KindEnum": "fleet.models.DeviceGroup.Kind",
        "VersionKindEnum": "registry.models.ModelVersion.Kind",
        "VersionStatusEnum": "registry.models.ModelVersion.Status",
        "ConversionJobStatusEnum": "registry.models.ConversionJob.Status",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ferry_cloud.api_schema.declare_errors",
    ],
    # Vendored by drf-spectacular-sidecar: nothing comes from a CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Rate limits (ferry_cloud/throttling.py): "<requests>/<s|min|hour|day>", or "off" ---------
FERRY_API_RATE = os.environ.get("FERRY_API_RATE", "600/min")  # per API token or session user
FERRY_API_ANON_RATE = os.environ.get("FERRY_API_ANON_RATE", "60/min")  # per IP, no credential

# --- The event stream (ferry_cloud/event_stream.py) -------------------------------------------
# A stream ends after this long and the client reconnects with Last-Event-ID: under gunicorn's
# gthread workers an open stream holds a thread, so none may hold one for ever.
FERRY_SSE_MAX_SECONDS = float(os.environ.get("FERRY_SSE_MAX_SECONDS", "55") or 55)
FERRY_SSE_HEARTBEAT_SECONDS = float(os.environ.get("FERRY_SSE_HEARTBEAT_SECONDS", "15") or 15)
FERRY_SSE_POLL_SECONDS = float(os.environ.get("FERRY_SSE_POLL_SECONDS", "1") or 1)
# Streams per web process at once; the default leaves half of a worker's threads to requests.
FERRY_SSE_STREAMS_PER_PROCESS = int(
    os.environ.get("FERRY_SSE_STREAMS_PER_PROCESS", "")
    or max(1, int(os.environ.get("FERRY_WEB_THREADS", "4") or 4) // 2)
)

# --- API tokens (accounts/tokens.py) ----------------------------------------------
# Lifetime of a new API token unless its creator asks for less (or, up to the maximum, more).
FERRY_API_TOKEN_DAYS = int(os.environ.get("FERRY_API_TOKEN_DAYS", "90") or 90)
FERRY_API_TOKEN_MAX_DAYS = int(os.environ.get("FERRY_API_TOKEN_MAX_DAYS", "365") or 365)
# Lifetime of a new enrolment token unless its creator names one (fleet/services.py).
FERRY_ENROLMENT_TOKEN_HOURS = int(os.environ.get("FERRY_ENROLMENT_TOKEN_HOURS", "24") or 24)
