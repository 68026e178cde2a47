"""Logging: structured lines on standard error, through structlog.

FERRY_LOG_FORMAT: "json" (one JSON object a line, the default) or "console" (human-readable,
what the demo uses); FERRY_LOG_LEVEL sets the level.  Secrets are redacted before rendering.
"""

from __future__ import annotations

import os

from ferry_cloud.observability.logs import configure_structlog, logging_config

FERRY_LOG_FORMAT = os.environ.get("FERRY_LOG_FORMAT", "json").strip().lower() or "json"
LOGGING = logging_config(FERRY_LOG_FORMAT, os.environ.get("FERRY_LOG_LEVEL", "INFO"))
configure_structlog()
