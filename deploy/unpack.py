"""Old import path of deploy.package.verify, kept for callers outside deploy/ (see deploy/package)."""

from deploy.package.verify import (  # noqa: F401
    MAX_ENTRIES,
    MAX_MANIFEST_BYTES,
    MAX_TOTAL_BYTES,
    ClaimsCheck,
    UnpackLimits,
    VerifiedPackage,
    verify_and_unpack,
)
