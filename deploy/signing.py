"""Ed25519 signatures over a package's manifest.

The manifest lists every other file of the package with its sha256 and size, so
signing its exact bytes signs the whole package.  The signature travels inside the
archive as ``manifest.sig``, the member right after ``manifest.json``, so a device
can check it before it reads (let alone unpacks) anything else.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy.errors import SignatureError, UnsafeArchiveError

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
ALGORITHM = "ed25519"


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
    """A short, stable name for a public key (shown in logs and signatures)."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def sign_manifest(manifest: bytes, private_key: bytes) -> bytes:
    """The manifest.sig bytes for these exact manifest bytes (Ed25519 is deterministic)."""
    private = Ed25519PrivateKey.from_private_bytes(private_key)
    signature = private.sign(manifest)
    body = {
        "algorithm": ALGORITHM,
        "key_id": key_id(public_key_of(private)),
        "signature": base64.b64encode(signature).decode(),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def verify_manifest(manifest: bytes, signature_file: bytes, public_key: bytes) -> dict:
    """Check manifest.sig against the trusted key; return the parsed manifest or raise SignatureError."""
    try:
        body = json.loads(signature_file)
        signature = base64.b64decode(body["signature"], validate=True)
        algorithm = body["algorithm"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{SIGNATURE} is malformed ({exc})") from exc
    if algorithm != ALGORITHM:
        raise SignatureError(f"{SIGNATURE} uses {algorithm!r}; only {ALGORITHM} is accepted")
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, manifest)
    except InvalidSignature:
        raise SignatureError(
            f"manifest signature does not verify against the trusted release key {key_id(public_key)} "
            f"(signed by key {body.get('key_id', '?')})"
        ) from None
    try:
        return json.loads(manifest)
    except ValueError as exc:
        raise SignatureError(f"{MANIFEST} is signed but is not valid JSON ({exc})") from exc


def _deterministic_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info


def sign_package(src: str | os.PathLike[str], dst: str | os.PathLike[str], private_key: bytes) -> str:
    """Copy the unsigned package at src to dst with manifest.sig inserted after the manifest.

    Returns the sha256 of the signed archive.  The output is byte-for-byte the same
    for the same input and key, so re-running a crashed job gives the same package.
    """
    with tarfile.open(src, mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.name != SIGNATURE]
        if not members or members[0].name != MANIFEST or not members[0].isfile():
            raise UnsafeArchiveError(f"{src}: the first member must be {MANIFEST}")
        manifest = tar.extractfile(members[0]).read()
        signature = sign_manifest(manifest, private_key)
        dst = Path(dst)
        tmp = dst.with_name(dst.name + ".tmp")
        with open(tmp, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as out:
            out.addfile(_deterministic_info(MANIFEST, len(manifest)), io.BytesIO(manifest))
            out.addfile(_deterministic_info(SIGNATURE, len(signature)), io.BytesIO(signature))
            for member in members[1:]:
                if not member.isfile():
                    raise UnsafeArchiveError(f"{src}: member {member.name!r} is not a regular file")
                out.addfile(_deterministic_info(member.name, member.size), tar.extractfile(member))
    with open(tmp, "rb+") as raw:
        os.fsync(raw.fileno())
    os.replace(tmp, dst)
    return file_sha256(dst)


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
