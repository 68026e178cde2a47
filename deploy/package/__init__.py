"""The package container: one library for writing, reading, signing, verifying and unpacking.

(threat model: see below; filled in with the agent's single pass)
"""

from deploy.package.digest import file_sha256
from deploy.package.manifest import (
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    SIGNATURE,
    WEIGHTS,
    Manifest,
    canonical_json,
    read_unpacked,
)
from deploy.package.reader import read_claims
from deploy.package.signing import (
    ANY_DEVICE_CLASS,
    KeyPair,
    SignedClaims,
    VerifiedManifest,
    generate_keypair,
    key_id,
    public_key_of,
    sign_manifest,
    verify_envelope,
)
from deploy.package.verify import ClaimsCheck, UnpackLimits, VerifiedPackage, verify_and_unpack
from deploy.package.writer import sign_package, write_archive, write_package

__all__ = [
    "ANY_DEVICE_CLASS",
    "FORMAT",
    "FORMAT_VERSION",
    "GRAPH",
    "MANIFEST",
    "SIGNATURE",
    "WEIGHTS",
    "ClaimsCheck",
    "KeyPair",
    "Manifest",
    "SignedClaims",
    "UnpackLimits",
    "VerifiedManifest",
    "VerifiedPackage",
    "canonical_json",
    "file_sha256",
    "generate_keypair",
    "key_id",
    "public_key_of",
    "read_claims",
    "read_unpacked",
    "sign_manifest",
    "sign_package",
    "verify_and_unpack",
    "verify_envelope",
    "write_archive",
    "write_package",
]
