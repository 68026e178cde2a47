"""Ed25519 over the manifest's sha256 and the claims."""

from __future__ import annotations

import hashlib

import pytest

from deploy.errors import SignatureError
from deploy.package import SignedClaims, key_id, sign_manifest, verify_envelope
from deploy.package.signing import DEFAULT_CLAIMS, signed_message
from tests.deploy.package.helpers import KEYS

MANIFEST = b'{"files":[]}'


def test_the_envelope_carries_the_claims_it_signs():
    claims = SignedClaims(device_class="pi4", organisation="12")
    envelope = sign_manifest(MANIFEST, KEYS.private_key, claims)
    assert envelope == sign_manifest(MANIFEST, KEYS.private_key, claims)  # Ed25519 is deterministic
    verified = verify_envelope(MANIFEST, envelope, KEYS.public_key)
    assert (verified.claims, verified.manifest) == (claims, {"files": []})
    assert verified.key_id == key_id(KEYS.public_key)
    assert verified.manifest_sha256 == hashlib.sha256(MANIFEST).hexdigest()


def test_the_signed_message_names_the_manifest_digest_and_every_claim():
    message = signed_message(MANIFEST, DEFAULT_CLAIMS)
    assert message.startswith(b"ferry-package-v2\n")
    for part in (b'"device_class":"*"', b'"organisation":""', b'"manifest_sha256":'):
        assert part in message


def test_another_manifest_does_not_verify():
    envelope = sign_manifest(MANIFEST, KEYS.private_key)
    with pytest.raises(SignatureError, match="does not verify against the trusted release key"):
        verify_envelope(b'{"files":[1]}', envelope, KEYS.public_key)
