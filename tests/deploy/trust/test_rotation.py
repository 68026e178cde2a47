"""Release-key rotation: what a device takes, and every way an attacker's rotation is refused."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.package import generate_keypair
from deploy.trust import assignment
from deploy.trust.rotation import (
    MAX_KEYS,
    MAX_ROTATION_BYTES,
    KeyRotation,
    RotationBadSignature,
    RotationMalformed,
    RotationRefused,
    RotationStale,
    sign_rotation,
    signed_message,
    unverified_keys,
    verify_rotation,
)

OLD = generate_keypair()
NEW = generate_keypair()
ATTACKER = generate_keypair()
NOW = 1_800_000_000


def _signed_by_old(blob: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(OLD.private_key).sign(signed_message(blob))


def _rotation(sequence: int = 1, keys: tuple[bytes, ...] | None = None) -> KeyRotation:
    return KeyRotation(keys=keys or (NEW.public_key,), sequence=sequence, issued_at=NOW)


def test_a_rotation_signed_by_the_old_key_hands_over_the_new_key_set() -> None:
    blob, signature = sign_rotation(_rotation(), OLD.private_key)
    rotation = verify_rotation(blob, signature, [OLD.public_key], last_sequence=0)
    assert rotation.keys == (NEW.public_key,)
    assert rotation.sequence == 1 and rotation.issued_at == NOW
    # The next rotation must be signed by the key that is trusted after the first one.
    blob2, signature2 = sign_rotation(_rotation(2, (OLD.public_key,)), NEW.private_key)
    assert verify_rotation(blob2, signature2, list(rotation.keys), last_sequence=1).keys == (OLD.public_key,)
    with pytest.raises(RotationBadSignature):
        verify_rotation(blob2, signature2, [OLD.public_key], last_sequence=1)


def test_a_rotation_signed_by_another_key_is_refused() -> None:
    blob, signature = sign_rotation(_rotation(), ATTACKER.private_key)
    with pytest.raises(RotationBadSignature) as refused:
        verify_rotation(blob, signature, [OLD.public_key], last_sequence=0)
    assert refused.value.code == "bad_signature"
    assert "trusted keys stay" in str(refused.value)


def test_an_older_or_equal_sequence_is_refused_as_stale() -> None:
    blob, signature = sign_rotation(_rotation(3), OLD.private_key)
    for last in (3, 4, 10**9):
        with pytest.raises(RotationStale) as refused:
            verify_rotation(blob, signature, [OLD.public_key], last_sequence=last)
        assert refused.value.code == "stale"


def test_an_assignment_signature_never_passes_for_a_rotation() -> None:
    blob = _rotation().to_bytes()
    other_domain = Ed25519PrivateKey.from_private_bytes(OLD.private_key).sign(assignment.signed_message(blob))
    with pytest.raises(RotationBadSignature):
        verify_rotation(blob, other_domain, [OLD.public_key], last_sequence=0)


def test_altered_bytes_fail_the_signature() -> None:
    blob, signature = sign_rotation(_rotation(), OLD.private_key)
    forged = blob.replace(NEW.public_key.hex().encode(), ATTACKER.public_key.hex().encode())
    with pytest.raises(RotationBadSignature):
        verify_rotation(forged, signature, [OLD.public_key], last_sequence=0)


@pytest.mark.parametrize(
    "body",
    [
        {"keys": [], "sequence": 1, "issued_at": NOW},
        {"keys": ["zz" * 32], "sequence": 1, "issued_at": NOW},
        {"keys": ["ab" * 31], "sequence": 1, "issued_at": NOW},
        {"keys": ["ab" * 32, "ab" * 32], "sequence": 1, "issued_at": NOW},
        {"keys": ["ab" * 32] * 1, "sequence": 0, "issued_at": NOW},
        {"keys": ["ab" * 32], "sequence": True, "issued_at": NOW},
        {"keys": ["ab" * 32], "sequence": 1, "issued_at": -1},
        {"keys": ["ab" * 32], "sequence": 1},
        {"keys": ["ab" * 32], "sequence": 1, "issued_at": NOW, "extra": 1},
        {"keys": "ab" * 32, "sequence": 1, "issued_at": NOW},
        {"keys": [f"{i:064x}" for i in range(MAX_KEYS + 1)], "sequence": 1, "issued_at": NOW},
        [1, 2, 3],
    ],
)
def test_a_signed_but_malformed_rotation_is_refused(body) -> None:
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = _signed_by_old(blob)
    with pytest.raises(RotationMalformed) as refused:
        verify_rotation(blob, signature, [OLD.public_key], last_sequence=0)
    assert refused.value.code == "malformed"


def test_non_canonical_bytes_are_refused_even_when_signed() -> None:
    blob = json.dumps({"sequence": 1, "issued_at": NOW, "keys": [NEW.public_key.hex().upper()]}).encode()
    signature = _signed_by_old(blob)
    with pytest.raises(RotationMalformed):
        verify_rotation(blob, signature, [OLD.public_key], last_sequence=0)


def test_wrong_sizes_are_refused_before_any_verification() -> None:
    blob, signature = sign_rotation(_rotation(), OLD.private_key)
    with pytest.raises(RotationMalformed):
        verify_rotation(blob, signature[:-1], [OLD.public_key], last_sequence=0)
    with pytest.raises(RotationMalformed):
        verify_rotation(b"x" * (MAX_ROTATION_BYTES + 1), signature, [OLD.public_key], last_sequence=0)
    with pytest.raises(RotationMalformed):
        verify_rotation(b"", signature, [OLD.public_key], last_sequence=0)
    with pytest.raises(RotationMalformed):
        verify_rotation("text", signature, [OLD.public_key], last_sequence=0)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=MAX_ROTATION_BYTES + 8), signature=st.binary(max_size=80))
def test_hostile_bytes_are_refused_with_a_coded_error(blob: bytes, signature: bytes) -> None:
    with pytest.raises(RotationRefused) as refused:
        verify_rotation(blob, signature, [OLD.public_key], last_sequence=0)
    assert refused.value.code in {"malformed", "bad_signature"}


@settings(max_examples=100, deadline=None)
@given(
    body=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=70),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.sampled_from(["keys", "sequence", "issued_at", "x"]), children, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_any_signed_json_is_taken_only_if_well_formed(body) -> None:
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = _signed_by_old(blob)
    try:
        rotation = verify_rotation(blob, signature, [OLD.public_key], last_sequence=0)
    except RotationRefused as refused:
        assert refused.code in {"malformed", "stale"}
    else:
        assert rotation.to_bytes() == blob and all(len(k) == 32 for k in rotation.keys)


def test_unverified_keys_reads_a_well_formed_rotation_and_nothing_else() -> None:
    blob, _ = sign_rotation(_rotation(), ATTACKER.private_key)
    assert unverified_keys(blob) == (NEW.public_key,)
    assert unverified_keys(b"{}") is None and unverified_keys(b"\xff" * 10) is None


@settings(max_examples=100, deadline=None)
@given(blob=st.binary(max_size=MAX_ROTATION_BYTES + 8))
def test_unverified_keys_never_raises(blob: bytes) -> None:
    assert unverified_keys(blob) is None or all(len(k) == 32 for k in unverified_keys(blob))
