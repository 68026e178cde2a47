"""Ed25519 signatures over a package's manifest, and the claims signed with it.

The manifest lists every other file of the package with its sha256 and size, so
signing its exact bytes signs the whole package.  The signature travels inside the
archive as ``manifest.sig``, the member right after ``manifest.json``, so a device
can check it before it reads (let alone unpacks) anything else.

The envelope also carries claims the control plane makes about this package, signed
with it once, at conversion (the image role): the ``device_class`` it is meant for ("*"
for any) and the ``organisation`` (tenant id) it belongs to.  Which device runs it, and
in what order (rollbacks, pins), is a signed per-device assignment (deploy.trust), never
a property of the package.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy.errors import SignatureError
from deploy.package.digest import bytes_sha256
from deploy.package.manifest import MANIFEST, SIGNATURE

ALGORITHM = "ed25519"
ANY_DEVICE_CLASS = "*"
SIGNED_MESSAGE_PREFIX = b"ferry-package-v2\n"  # v1 signed a release counter and a rollback flag


@dataclass(frozen=True)
class SignedClaims:
    """What the control plane vouches for beside the manifest's bytes."""

    device_class: str = ANY_DEVICE_CLASS
    organisation: str = ""  # the tenant id; a device refuses another tenant's package

    def __post_init__(self) -> None:
        if not isinstance(self.device_class, str) or not self.device_class or "\n" in self.device_class:
            raise SignatureError(
                f"the device class must be a non-empty single-line string, not {self.device_class!r}"
            )
        organisation = self.organisation
        if not isinstance(organisation, str) or len(organisation) > 128 or "\n" in organisation:
            raise SignatureError(
                f"the organisation must be one line of at most 128 characters, not {organisation!r:.80}"
            )

    def matches(self, device_class: str) -> bool:
        return self.device_class in (ANY_DEVICE_CLASS, device_class)


DEFAULT_CLAIMS = SignedClaims()  # any device class, no organisation


@dataclass(frozen=True)
class VerifiedManifest:
    manifest: dict
    claims: SignedClaims
    key_id: str
    manifest_sha256: str = ""  # what a signed assignment names (deploy.trust)


def signed_message(manifest: bytes, claims: SignedClaims, manifest_sha256: str = "") -> bytes:
    """The exact bytes the release key signs: manifest digest and every claim, unambiguously.
    ``manifest_sha256`` passes the digest when the caller has it (each byte hashed once)."""
    return (
        SIGNED_MESSAGE_PREFIX
        + json.dumps(
            {
                "manifest_sha256": manifest_sha256 or bytes_sha256(manifest),
                "device_class": claims.device_class,
                "organisation": claims.organisation,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
    )


@dataclass(frozen=True)
class KeyPair:
    private_key: bytes  # raw 32 bytes
    public_key: bytes  # raw 32 bytes


def generate_keypair() -> KeyPair:
    private = Ed25519PrivateKey.generate()
    return KeyPair(
        private_key=private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        ),
        public_key=public_key_of(private),
    )


def public_key_of(private: Ed25519PrivateKey | bytes) -> bytes:
    if isinstance(private, bytes):
        private = Ed25519PrivateKey.from_private_bytes(private)
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: bytes) -> str:
    """A short, stable name for a public key (shown in logs and signatures).  Not through
    deploy.package.digest: a key is not package bytes."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def sign_manifest(manifest: bytes, private_key: bytes, claims: SignedClaims = SignedClaims()) -> bytes:
    """The manifest.sig bytes for these manifest bytes and claims (Ed25519 is deterministic)."""
    private = Ed25519PrivateKey.from_private_bytes(private_key)
    signature = private.sign(signed_message(manifest, claims))
    body = {
        "algorithm": ALGORITHM,
        "key_id": key_id(public_key_of(private)),
        "signature": base64.b64encode(signature).decode(),
        "device_class": claims.device_class,
        "organisation": claims.organisation,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _parse_envelope(signature_file: bytes) -> tuple[dict, bytes, SignedClaims]:
    try:
        body = json.loads(signature_file)
        signature = base64.b64decode(body["signature"], validate=True)
        algorithm = body["algorithm"]
        claims = SignedClaims(device_class=body["device_class"], organisation=body["organisation"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{SIGNATURE} is malformed ({type(exc).__name__}: {exc})") from exc
    if algorithm != ALGORITHM:
        raise SignatureError(f"{SIGNATURE} uses {algorithm!r}; only {ALGORITHM} is accepted")
    return body, signature, claims


def verify_envelope(manifest: bytes, signature_file: bytes, public_key: bytes) -> VerifiedManifest:
    """Check manifest.sig against the trusted key; return the manifest and the signed claims."""
    body, signature, claims = _parse_envelope(signature_file)
    manifest_sha256 = bytes_sha256(manifest)
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            signature, signed_message(manifest, claims, manifest_sha256)
        )
    except InvalidSignature:
        raise SignatureError(
            f"manifest signature does not verify against the trusted release key {key_id(public_key)} "
            f"(signed by key {body.get('key_id', '?')}, or the manifest or its claims were altered)"
        ) from None
    try:
        parsed = json.loads(manifest)
    except ValueError as exc:
        raise SignatureError(f"{MANIFEST} is signed but is not valid JSON ({exc})") from exc
    return VerifiedManifest(
        manifest=parsed, claims=claims, key_id=key_id(public_key), manifest_sha256=manifest_sha256
    )


def verify_manifest(manifest: bytes, signature_file: bytes, public_key: bytes) -> dict:
    """Check manifest.sig against the trusted key; return the parsed manifest or raise SignatureError."""
    return verify_envelope(manifest, signature_file, public_key).manifest
