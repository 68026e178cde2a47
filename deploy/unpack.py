"""Old import path of the package library's verify-and-unpack (deploy/package), for outside callers."""

from deploy.package.verify import (
    MAX_ENTRIES,
    MAX_MANIFEST_BYTES,
    MAX_TOTAL_BYTES,
    ClaimsCheck,
    UnpackLimits,
    VerifiedPackage,
    verify_and_unpack,
)

__all__ = [
    "MAX_ENTRIES",
    "MAX_MANIFEST_BYTES",
    "MAX_TOTAL_BYTES",
    "ClaimsCheck",
    "UnpackLimits",
    "VerifiedPackage",
    "verify_and_unpack",
]
