"""Old import path of the package library's signing (deploy/package), for callers outside deploy/."""

from deploy.package.digest import file_sha256
from deploy.package.manifest import MANIFEST, SIGNATURE
from deploy.package.reader import read_claims
from deploy.package.signing import (
    ALGORITHM,
    ANY_DEVICE_CLASS,
    KeyPair,
    SignedClaims,
    VerifiedManifest,
    generate_keypair,
    key_id,
    public_key_of,
    sign_manifest,
    signed_message,
    verify_envelope,
    verify_manifest,
)
from deploy.package.writer import sign_package

__all__ = [
    "ALGORITHM",
    "ANY_DEVICE_CLASS",
    "MANIFEST",
    "SIGNATURE",
    "KeyPair",
    "SignedClaims",
    "VerifiedManifest",
    "file_sha256",
    "generate_keypair",
    "key_id",
    "public_key_of",
    "read_claims",
    "sign_manifest",
    "sign_package",
    "signed_message",
    "verify_envelope",
    "verify_manifest",
]
