"""Webhooks (platform/webhooks/): how deliveries are attempted and retried."""

from __future__ import annotations

import os

from .security import PRODUCTION

FERRY_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("FERRY_WEBHOOK_TIMEOUT_SECONDS", "10") or 10)
# Attempt n+1 waits BASE * 2^(n-1) seconds, at most MAX: 30 s, 1, 2, 4 ... min, then hourly.
FERRY_WEBHOOK_MAX_ATTEMPTS = int(os.environ.get("FERRY_WEBHOOK_MAX_ATTEMPTS", "12") or 12)
FERRY_WEBHOOK_RETRY_BASE_SECONDS = float(os.environ.get("FERRY_WEBHOOK_RETRY_BASE_SECONDS", "30") or 30)
FERRY_WEBHOOK_RETRY_MAX_SECONDS = float(os.environ.get("FERRY_WEBHOOK_RETRY_MAX_SECONDS", "3600") or 3600)
# Private, loopback and link-local receivers: allowed outside production, refused in it unless 1.
FERRY_WEBHOOK_ALLOW_PRIVATE = os.environ.get("FERRY_WEBHOOK_ALLOW_PRIVATE", "0" if PRODUCTION else "1") == "1"
