"""Signed per-device assignments: "device D runs package P now" (Uptane's director role).

The package signature (deploy.package, the image role) says what a package is and for whom
(device class, organisation); it is made once, at conversion.  Which device runs which package,
and until when, is an assignment the control plane signs for one device at a time, with a
per-device ``counter`` that only goes up.  A device accepts an assignment only if it is signed
by a trusted key, names this device and its organisation, has not expired, and carries a
counter above the last one it accepted (or is that very assignment again).  Rolling back,
re-releasing, pinning and unpinning are all just new assignments; a replayed old one is
refused.  The signed message starts with its own prefix, so an assignment signature can never
pass for a package signature or the reverse, even under the same key.

Pure: no Django, no I/O; the control plane signs, the agent verifies.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy.errors import DeployError

SIGNED_MESSAGE_PREFIX = b"ferry-assignment-v1\n"
MAX_ASSIGNMENT_BYTES = 4096
SIGNATURE_BYTES = 64
MAX_COUNTER = (1 << 63) - 1
MAX_LIFETIME_SECONDS = 90 * 24 * 3600
MAX_PACKAGE_BYTES = 1 << 40
DEFAULT_SKEW_SECONDS = 300

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # opaque ids: never ".", "..", "/"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SHORT_TEXT = 128  # cron expressions and time zone names


class AssignmentRefused(DeployError):
    """A device must not act on this assignment; ``code`` says why, machine-readably."""

    code: ClassVar[str] = "refused"


class AssignmentMalformed(AssignmentRefused):
    code = "malformed"


class AssignmentBadSignature(AssignmentRefused):
    code = "bad_signature"


class AssignmentWrongDevice(AssignmentRefused):
    code = "wrong_device"


class AssignmentWrongTenant(AssignmentRefused):
    code = "wrong_tenant"


class AssignmentStaleCounter(AssignmentRefused):
    code = "stale_counter"


class AssignmentExpired(AssignmentRefused):
    code = "expired"


@dataclass(frozen=True)
class Assignment:
    """What the control plane tells one device to run; every field is signed."""

    device_id: str
    organisation_id: str
    counter: int
    issued_at: int
    expires_at: int
    version_id: str
    release_id: str  # "" for pins and rollbacks
    package_digest: str  # sha256 of the whole archive
    package_size: int
    manifest_sha256: str  # what the package signature covers
    rollback: bool = False  # informational: the device is sent back to an older version
    download_only: bool = False
    window: dict[str, Any] | None = None  # {"cron", "duration_seconds", "timezone"}

    def __post_init__(self) -> None:
        _check_fields(asdict(self))

    def to_bytes(self) -> bytes:
        return canonical(asdict(self))

    @classmethod
    def from_dict(cls, data: Any) -> Assignment:
        if not isinstance(data, dict) or set(data) != _FIELDS:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise AssignmentMalformed(f"an assignment has exactly the fields {sorted(_FIELDS)}, not {keys}")
        return cls(**data)


_FIELDS = frozenset(Assignment.__dataclass_fields__)


def canonical(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise AssignmentMalformed(f"assignment field {name} must be an integer from {low} to {high}")


def _text(name: str, value: Any, pattern: re.Pattern[str], *, empty: bool = False) -> None:
    if not isinstance(value, str) or not ((empty and value == "") or pattern.fullmatch(value)):
        raise AssignmentMalformed(f"assignment field {name} must match {pattern.pattern}, got {value!r:.80}")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise AssignmentMalformed(f"assignment field {name} must be a boolean")


def _check_window(window: Any) -> None:
    if window is None:
        return
    if not isinstance(window, dict) or set(window) != {"cron", "duration_seconds", "timezone"}:
        raise AssignmentMalformed(
            "assignment field window must be null or {cron, duration_seconds, timezone}"
        )
    for name in ("cron", "timezone"):
        value = window[name]
        if not isinstance(value, str) or not 0 < len(value) <= _SHORT_TEXT or not value.isprintable():
            raise AssignmentMalformed(
                f"window {name} must be printable text of at most {_SHORT_TEXT} characters"
            )
    _int("window.duration_seconds", window["duration_seconds"], 1, MAX_LIFETIME_SECONDS)


def _check_fields(data: dict[str, Any]) -> None:
    _text("device_id", data["device_id"], _TOKEN)
    _text("organisation_id", data["organisation_id"], _TOKEN)
    _int("counter", data["counter"], 1, MAX_COUNTER)
    _int("issued_at", data["issued_at"], 0, MAX_COUNTER)
    _int("expires_at", data["expires_at"], data["issued_at"] + 1, data["issued_at"] + MAX_LIFETIME_SECONDS)
    _text("version_id", data["version_id"], _TOKEN)
    _text("release_id", data["release_id"], _TOKEN, empty=True)
    _text("package_digest", data["package_digest"], _HEX64)
    _int("package_size", data["package_size"], 1, MAX_PACKAGE_BYTES)
    _text("manifest_sha256", data["manifest_sha256"], _HEX64)
    _bool("rollback", data["rollback"])
    _bool("download_only", data["download_only"])
    _check_window(data["window"])


def signed_message(blob: bytes) -> bytes:
    return SIGNED_MESSAGE_PREFIX + blob


def blob_sha256(blob: bytes) -> str:
    """Names an accepted assignment (the same bytes again after a restart are not a replay)."""
    return hashlib.sha256(blob).hexdigest()


def sign_assignment(assignment: Assignment, private_key: bytes) -> tuple[bytes, bytes]:
    """(canonical JSON bytes, Ed25519 signature over the domain-separated message)."""
    blob = assignment.to_bytes()
    if len(blob) > MAX_ASSIGNMENT_BYTES:
        raise AssignmentMalformed(f"the assignment is {len(blob)} bytes, over {MAX_ASSIGNMENT_BYTES}")
    signature = Ed25519PrivateKey.from_private_bytes(private_key).sign(signed_message(blob))
    return blob, signature


def _parse(blob: bytes) -> Assignment:
    try:
        data = json.loads(blob.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AssignmentMalformed(f"the assignment is not canonical JSON ({type(exc).__name__})") from None
    assignment = Assignment.from_dict(data)
    if assignment.to_bytes() != blob:
        raise AssignmentMalformed("the assignment is not in canonical form (sorted keys, no spaces)")
    return assignment


def _check_signature(blob: bytes, signature: bytes, trusted_keys: list[bytes]) -> None:
    message = signed_message(blob)
    for key in trusted_keys:
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
            return
        except (InvalidSignature, ValueError):
            continue
    raise AssignmentBadSignature(
        f"the assignment's signature does not verify against any of the {len(trusted_keys)} trusted keys "
        "(signed by another key, or altered on the way)"
    )


def verify_assignment(
    blob: bytes,
    signature: bytes,
    trusted_keys: list[bytes],
    *,
    device_id: str,
    organisation_id: str,
    last_counter: int,
    now: float,
    skew: float = DEFAULT_SKEW_SECONDS,
    last_sha256: str = "",
) -> Assignment:
    """The assignment if this device may act on it, else an AssignmentRefused subclass.

    ``last_counter`` is the highest counter this device accepted; an assignment with that very
    counter is accepted only if it is the same bytes (``last_sha256``): the one assignment,
    seen again after a restart or at the next check-in.
    """
    if not isinstance(blob, bytes) or not isinstance(signature, bytes):
        raise AssignmentMalformed("the assignment and its signature must be bytes")
    if not 0 < len(blob) <= MAX_ASSIGNMENT_BYTES:
        raise AssignmentMalformed(
            f"the assignment is {len(blob)} bytes; 1 to {MAX_ASSIGNMENT_BYTES} expected"
        )
    if len(signature) != SIGNATURE_BYTES:
        raise AssignmentMalformed(
            f"the assignment signature is {len(signature)} bytes, not {SIGNATURE_BYTES}"
        )
    _check_signature(blob, signature, trusted_keys)
    assignment = _parse(blob)
    if assignment.device_id != device_id:
        raise AssignmentWrongDevice(
            f"the assignment is for device {assignment.device_id}, this is device {device_id}"
        )
    if assignment.organisation_id != organisation_id:
        raise AssignmentWrongTenant(
            f"the assignment is for organisation {assignment.organisation_id}, "
            f"this device belongs to {organisation_id}"
        )
    same_again = assignment.counter == last_counter and last_sha256 == blob_sha256(blob)
    if assignment.counter <= last_counter and not same_again:
        raise AssignmentStaleCounter(
            f"assignment counter {assignment.counter} is not above {last_counter}, the last this device "
            "accepted: an old assignment replayed"
        )
    if now > assignment.expires_at + skew:
        raise AssignmentExpired(
            f"the assignment expired at {assignment.expires_at} (now {int(now)}, {int(skew)} s of clock skew "
            "allowed): the control plane issues a fresh one at the next check-in"
        )
    return assignment
