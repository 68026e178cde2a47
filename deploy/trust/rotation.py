"""Release-key rotation: the only way a device's trusted release keys change after enrolment.

A device trusts the release keys it received in its CA-signed enrolment grant.  To replace
them, the control plane signs a ``KeyRotation`` (the new key set, a ``sequence`` that only goes
up, ``issued_at``) with a key the device trusts *now*, i.e. the old key.  A device accepts a
rotation only if that signature verifies against its current keys and the sequence is above
the last one it accepted (or is that very rotation again, seen at the next check-in).  The
signed message has its own prefix, so a rotation signature never passes for a package or an
assignment signature, nor the reverse, even under the same key.

A device offline through several rotations catches up through the chain: every rotation above
the one it holds, in order, each verified by the keys trusted at that step (``verify_chain``), so
a key retired along the way is still followed as long as each link is signed by its predecessor.
A chain is at most ``MAX_CHAIN`` links; a device further behind must be enrolled again.

Pure: no Django, no I/O; the control plane signs, the agent verifies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy.errors import DeployError

SIGNED_MESSAGE_PREFIX = b"ferry-key-rotation-v1\n"
MAX_ROTATION_BYTES = 2048
MAX_KEYS = 8
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
MAX_SEQUENCE = (1 << 63) - 1
MAX_CHAIN = 16  # rotations a device may catch up on in one check-in; further behind: re-enrol
_FIELDS = frozenset({"keys", "sequence", "issued_at"})


class RotationRefused(DeployError):
    """A device must not take this key rotation; ``code`` says why, machine-readably."""

    code: ClassVar[str] = "refused"


class RotationMalformed(RotationRefused):
    code = "malformed"


class RotationBadSignature(RotationRefused):
    code = "bad_signature"


class RotationStale(RotationRefused):
    code = "stale"


class RotationChainTooLong(RotationRefused):
    code = "chain_too_long"


@dataclass(frozen=True)
class KeyRotation:
    """The release keys a device trusts from now on; every field is signed."""

    keys: tuple[bytes, ...]  # raw 32-byte Ed25519 public keys
    sequence: int
    issued_at: int

    def __post_init__(self) -> None:
        keys = self.keys
        if not isinstance(keys, tuple) or not 0 < len(keys) <= MAX_KEYS:
            raise RotationMalformed(f"a key rotation names 1 to {MAX_KEYS} keys as a tuple")
        if any(not isinstance(k, bytes) or len(k) != PUBLIC_KEY_BYTES for k in keys):
            raise RotationMalformed(f"each rotated key is a raw {PUBLIC_KEY_BYTES}-byte Ed25519 public key")
        if len(set(keys)) != len(keys):
            raise RotationMalformed("a key rotation names each key once")
        _int("sequence", self.sequence, 1, MAX_SEQUENCE)
        _int("issued_at", self.issued_at, 0, MAX_SEQUENCE)

    def to_bytes(self) -> bytes:
        body = {"keys": [k.hex() for k in self.keys], "sequence": self.sequence, "issued_at": self.issued_at}
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RotationMalformed(f"key rotation field {name} must be an integer from {low} to {high}")


def signed_message(blob: bytes) -> bytes:
    return SIGNED_MESSAGE_PREFIX + blob


def sign_rotation(rotation: KeyRotation, old_private_key: bytes) -> tuple[bytes, bytes]:
    """(canonical JSON bytes, Ed25519 signature by the key devices trust now)."""
    blob = rotation.to_bytes()
    if len(blob) > MAX_ROTATION_BYTES:
        raise RotationMalformed(f"the key rotation is {len(blob)} bytes, over {MAX_ROTATION_BYTES}")
    return blob, Ed25519PrivateKey.from_private_bytes(old_private_key).sign(signed_message(blob))


def _key(text: Any) -> bytes:
    if not isinstance(text, str) or len(text) != 2 * PUBLIC_KEY_BYTES:
        raise RotationMalformed(f"each rotated key is {2 * PUBLIC_KEY_BYTES} hex characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise RotationMalformed("a rotated key is not hex") from None


def _parse(blob: bytes) -> KeyRotation:
    try:
        data = json.loads(blob.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RotationMalformed(f"the key rotation is not canonical JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict) or set(data) != _FIELDS:
        raise RotationMalformed(f"a key rotation has exactly the fields {sorted(_FIELDS)}")
    if not isinstance(data["keys"], list):
        raise RotationMalformed("key rotation field keys must be a list")
    rotation = KeyRotation(
        keys=tuple(_key(k) for k in data["keys"]), sequence=data["sequence"], issued_at=data["issued_at"]
    )
    if rotation.to_bytes() != blob:
        raise RotationMalformed("the key rotation is not in canonical form (sorted keys, lower-case hex)")
    return rotation


def unverified_rotation(blob: bytes) -> KeyRotation | None:
    """The rotation a blob names, signature NOT checked: only to recognise one that changes
    nothing (a device enrolled after it already holds its keys); never to trust a key."""
    try:
        return _parse(blob) if isinstance(blob, bytes) and len(blob) <= MAX_ROTATION_BYTES else None
    except RotationMalformed:
        return None


def unverified_keys(blob: bytes) -> tuple[bytes, ...] | None:
    """The key set a rotation names, signature NOT checked (see unverified_rotation)."""
    rotation = unverified_rotation(blob)
    return None if rotation is None else rotation.keys


def _check_signature(blob: bytes, signature: bytes, trusted_keys: list[bytes]) -> None:
    message = signed_message(blob)
    for key in trusted_keys:
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
            return
        except (InvalidSignature, ValueError):
            continue
    raise RotationBadSignature(
        f"the key rotation's signature does not verify against any of the {len(trusted_keys)} trusted keys "
        "(not signed by the old key, or altered on the way); the trusted keys stay as they are"
    )


def verify_rotation(
    blob: bytes, signature: bytes, trusted_keys: list[bytes], last_sequence: int
) -> KeyRotation:
    """The rotation if this device should take it, else a RotationRefused subclass.

    ``last_sequence`` is the sequence of the rotation this device last took (0 for none).  The
    rotation it already took is signed by a key it no longer trusts, so a caller that sees the
    same bytes again at the next check-in skips them before calling this.
    """
    if not isinstance(blob, bytes) or not isinstance(signature, bytes):
        raise RotationMalformed("the key rotation and its signature must be bytes")
    if not 0 < len(blob) <= MAX_ROTATION_BYTES:
        raise RotationMalformed(f"the key rotation is {len(blob)} bytes; 1 to {MAX_ROTATION_BYTES} expected")
    if len(signature) != SIGNATURE_BYTES:
        raise RotationMalformed(
            f"the key rotation signature is {len(signature)} bytes, not {SIGNATURE_BYTES}"
        )
    _check_signature(blob, signature, trusted_keys)
    rotation = _parse(blob)
    if rotation.sequence <= last_sequence:
        raise RotationStale(
            f"key rotation {rotation.sequence} is not above {last_sequence}, the last this device took: "
            "an old rotation replayed"
        )
    return rotation


def verify_chain(
    links: Sequence[tuple[bytes, bytes]], trusted_keys: list[bytes], last_sequence: int
) -> list[KeyRotation]:
    """Every rotation of ``links`` (blob, signature), in order, if the device should take them all.

    Each link is verified by the keys the previous link named (the first by ``trusted_keys``)
    and must be above the previous sequence, so a skipped, altered or reordered link refuses the
    whole chain (the RotationRefused subclass of the first bad link, naming its position).
    """
    if len(links) > MAX_CHAIN:
        raise RotationChainTooLong(
            f"a key-rotation chain of {len(links)} links is over {MAX_CHAIN}: this device is too far "
            "behind to catch up; enrol it again"
        )
    keys, sequence, taken = list(trusted_keys), last_sequence, []
    for position, (blob, signature) in enumerate(links, 1):
        try:
            rotation = verify_rotation(blob, signature, keys, sequence)
        except RotationRefused as exc:
            raise type(exc)(f"link {position} of {len(links)} of the key-rotation chain: {exc}") from None
        keys, sequence = list(rotation.keys), rotation.sequence
        taken.append(rotation)
    return taken
