"""Old import path of deploy.package.signing, kept for callers outside deploy/ (see deploy/package)."""

from deploy.package.signing import (  # noqa: F401
    ALGORITHM,
    ANY_DEVICE_CLASS,
    MANIFEST,
    SIGNATURE,
    KeyPair,
    SignedClaims,
    VerifiedManifest,
    file_sha256,
    generate_keypair,
    key_id,
    public_key_of,
    read_claims,
    sign_manifest,
    sign_package,
    signed_message,
    verify_envelope,
    verify_manifest,
)
