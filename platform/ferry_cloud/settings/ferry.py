"""Ferry's own settings: release key, gateway, check-in interval, upload limit."""

from __future__ import annotations

import os
from pathlib import Path

from .base import DATA_DIR

# --- Ferry ----------------------------------------------------------------------
FERRY_RELEASE_KEY_FILE = Path(os.environ.get("FERRY_RELEASE_KEY_FILE", DATA_DIR / "keys" / "release.key"))
FERRY_GATEWAY_ADDRESS = os.environ.get("FERRY_GATEWAY_ADDRESS", "127.0.0.1:50051")
FERRY_CHECKIN_INTERVAL_SECONDS = int(os.environ.get("FERRY_CHECKIN_INTERVAL_SECONDS", "30"))
FERRY_MAX_UPLOAD_BYTES = int(os.environ.get("FERRY_MAX_UPLOAD_BYTES", str(512 << 20)))
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 << 20
# How long a signed device assignment is valid; check-ins reuse it while over half remains.
FERRY_ASSIGNMENT_TTL_SECONDS = int(os.environ.get("FERRY_ASSIGNMENT_TTL_SECONDS", str(7 * 24 * 3600)))
