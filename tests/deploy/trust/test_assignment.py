"""Signed per-device assignments: what a device accepts, and every way an attacker's is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.package import generate_keypair, sign_manifest
from deploy.trust.assignment import (
    MAX_ASSIGNMENT_BYTES,
    Assignment,
    AssignmentBadSignature,
    AssignmentExpired,
    AssignmentMalformed,
    AssignmentRefused,
    AssignmentStaleCounter,
    AssignmentWrongDevice,
    AssignmentWrongTenant,
    blob_sha256,
    canonical,
    sign_assignment,
    verify_assignment,
)

KEYS = generate_keypair()
OTHER = generate_keypair()
NOW = 1_800_000_000
DEVICE, ORG = "3f1c0d6e-8a55-4c1e-9b0e-2f7d3a1b9c11", "42"


def _assignment(**changes) -> Assignment:
    fields = dict(
        device_id=DEVICE,
        organisation_id=ORG,
        counter=1_700_000_000_000,
        issued_at=NOW,
        expires_at=NOW + 7 * 86400,
        version_id="v-2",
        release_id="r-1",
        package_digest="a" * 64,
        package_size=12345,
        manifest_sha256="b" * 64,
        rollback=False,
        download_only=False,
        window={"cron": "0 2 * * *", "duration_seconds": 3600, "timezone": "UTC"},
    )
    fields.update(changes)
    return Assignment(**fields)


def _verify(blob: bytes, signature: bytes, **changes) -> Assignment:
    kwargs = dict(
        trusted_keys=[KEYS.public_key], device_id=DEVICE, organisation_id=ORG, last_counter=0, now=NOW + 10
    )
    kwargs.update(changes)
    return verify_assignment(blob, signature, **kwargs)


def test_a_signed_assignment_verifies_and_round_trips():
    assignment = _assignment()
    blob, signature = sign_assignment(assignment, KEYS.private_key)
    assert _verify(blob, signature) == assignment
    # any trusted key will do (a key rotation lists the old and the new)
    assert _verify(blob, signature, trusted_keys=[OTHER.public_key, KEYS.public_key]) == assignment
    assert json.loads(blob)["counter"] == assignment.counter and blob == canonical(json.loads(blob))


@pytest.mark.parametrize(
    "changes,error,code",
    [
        (dict(device_id="another-device"), AssignmentWrongDevice, "wrong_device"),
        (dict(organisation_id="43"), AssignmentWrongTenant, "wrong_tenant"),
        (dict(last_counter=1_700_000_000_001), AssignmentStaleCounter, "stale_counter"),
        (dict(last_counter=1_700_000_000_000), AssignmentStaleCounter, "stale_counter"),
        (dict(now=NOW + 7 * 86400 + 301), AssignmentExpired, "expired"),
        (dict(trusted_keys=[OTHER.public_key]), AssignmentBadSignature, "bad_signature"),
        (dict(trusted_keys=[]), AssignmentBadSignature, "bad_signature"),
    ],
)
def test_refusals_carry_a_machine_readable_code(changes, error, code):
    blob, signature = sign_assignment(_assignment(), KEYS.private_key)
    with pytest.raises(error) as refused:
        _verify(blob, signature, **changes)
    assert refused.value.code == code and isinstance(refused.value, AssignmentRefused)
    assert str(refused.value)  # a human message beside the code


def test_the_same_assignment_again_is_accepted_but_an_older_replay_is_not():
    old_blob, old_sig = sign_assignment(_assignment(counter=5, version_id="v-1"), KEYS.private_key)
    new_blob, new_sig = sign_assignment(
        _assignment(counter=6, version_id="v-1", rollback=True), KEYS.private_key
    )
    accepted = _verify(new_blob, new_sig, last_counter=5)
    # after a restart, the very same bytes at the same counter continue; anything else at 6 does not
    again = _verify(new_blob, new_sig, last_counter=6, last_sha256=blob_sha256(new_blob))
    assert again == accepted and again.rollback
    with pytest.raises(AssignmentStaleCounter, match="replayed"):
        _verify(old_blob, old_sig, last_counter=6, last_sha256=blob_sha256(new_blob))
    other_blob, other_sig = sign_assignment(_assignment(counter=6, version_id="v-9"), KEYS.private_key)
    with pytest.raises(AssignmentStaleCounter):
        _verify(other_blob, other_sig, last_counter=6, last_sha256=blob_sha256(new_blob))


def test_an_assignment_signature_never_passes_for_a_package_signature():
    """Domain separation: the same key signs packages and assignments, the messages never collide."""
    blob, signature = sign_assignment(_assignment(), KEYS.private_key)
    envelope = json.loads(sign_manifest(blob, KEYS.private_key))
    import base64

    package_signature = base64.b64decode(envelope["signature"])
    assert package_signature != signature
    with pytest.raises(AssignmentBadSignature):
        _verify(blob, package_signature)


@pytest.mark.parametrize(
    "changes",
    [
        dict(counter=0),
        dict(counter=True),
        dict(counter="7"),
        dict(package_digest="A" * 64),
        dict(package_digest="a" * 63),
        dict(manifest_sha256="../../etc/passwd"),
        dict(version_id="../x"),
        dict(version_id=""),
        dict(version_id=".."),
        dict(release_id=".hidden"),
        dict(device_id="x" * 129),
        dict(package_size=0),
        dict(expires_at=NOW),
        dict(expires_at=NOW + 91 * 86400),
        dict(rollback=1),
        dict(window={"cron": "0 2 * * *"}),
        dict(window={"cron": "0 2 * * *", "duration_seconds": "60", "timezone": "UTC"}),
    ],
)
def test_bad_fields_are_refused_when_signing(changes):
    with pytest.raises(AssignmentMalformed):
        _assignment(**changes)


def _resign(data: dict) -> tuple[bytes, bytes]:
    """A trusted signer's bytes that were never built through Assignment (a buggy or odd signer)."""
    blob = canonical(data)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from deploy.trust.assignment import signed_message

    return blob, Ed25519PrivateKey.from_private_bytes(KEYS.private_key).sign(signed_message(blob))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("counter"),
        lambda d: d.update(extra="field"),
        lambda d: d.update(counter=-1),
        lambda d: d.update(counter=1.5),
        lambda d: d.update(device_id=None),
        lambda d: d.update(window=[]),
    ],
)
def test_signed_but_malformed_assignments_are_refused(mutate):
    data = dataclasses.asdict(_assignment())
    mutate(data)
    blob, signature = _resign(data)
    with pytest.raises(AssignmentMalformed):
        _verify(blob, signature)


def test_non_canonical_and_oversized_blobs_are_refused():
    data = dataclasses.asdict(_assignment())
    blob = json.dumps(data, indent=1).encode()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from deploy.trust.assignment import signed_message

    signature = Ed25519PrivateKey.from_private_bytes(KEYS.private_key).sign(signed_message(blob))
    with pytest.raises(AssignmentMalformed, match="canonical"):
        _verify(blob, signature)
    with pytest.raises(AssignmentMalformed, match="bytes"):
        _verify(b"{" * (MAX_ASSIGNMENT_BYTES + 1), signature)
    with pytest.raises(AssignmentMalformed, match="signature"):
        _verify(blob, signature[:10])
    with pytest.raises(AssignmentMalformed):
        _verify("text", signature)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(index=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_any_tampered_byte_is_refused(index, flip):
    blob, signature = sign_assignment(_assignment(), KEYS.private_key)
    both = bytearray(blob + signature)
    both[index % len(both)] ^= flip
    tampered_blob, tampered_sig = bytes(both[: len(blob)]), bytes(both[len(blob) :])
    with pytest.raises(AssignmentRefused) as refused:
        _verify(tampered_blob, tampered_sig)
    assert refused.value.code in ("bad_signature", "malformed")


@settings(max_examples=150, deadline=None)
@given(blob=st.binary(max_size=MAX_ASSIGNMENT_BYTES + 100), signature=st.binary(max_size=80))
def test_random_bytes_are_refused_with_a_code_never_a_crash(blob, signature):
    with pytest.raises(AssignmentRefused) as refused:
        _verify(blob, signature)
    assert refused.value.code in ("bad_signature", "malformed")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=300),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(sorted(Assignment.__dataclass_fields__)), value=_json_values)
def test_a_trusted_signer_with_any_wrong_typed_field_is_refused_or_valid(field, value):
    """Hostile values (huge strings, wrong types, nested junk) never crash verification."""
    data = dataclasses.asdict(_assignment())
    data[field] = value
    blob, signature = _resign(data)
    try:
        accepted = _verify(blob, signature)
    except AssignmentRefused as refused:
        assert refused.code in ("malformed", "wrong_device", "wrong_tenant", "stale_counter", "expired")
    else:
        assert getattr(accepted, field) == value


@settings(max_examples=100, deadline=None)
@given(
    last=st.integers(min_value=0, max_value=2**63 - 1), counter=st.integers(min_value=1, max_value=2**63 - 1)
)
def test_only_a_higher_counter_is_accepted(last, counter):
    blob, signature = sign_assignment(_assignment(counter=counter), KEYS.private_key)
    if counter > last:
        assert _verify(blob, signature, last_counter=last).counter == counter
    else:
        with pytest.raises(AssignmentStaleCounter):
            _verify(blob, signature, last_counter=last)
