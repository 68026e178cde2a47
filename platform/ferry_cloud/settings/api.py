"""The REST API (DRF) and its OpenAPI document (drf-spectacular)."""

from __future__ import annotations

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
    # Vendored by drf-spectacular-sidecar: nothing comes from a CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
