"""Key-rotation chains: a device offline through several rotations catches up link by link, each
verified by the keys trusted at that step; a skipped, altered, reordered or over-long chain is
refused whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.package import generate_keypair
from deploy.trust.rotation import (
    MAX_CHAIN,
    MAX_KEYS,
    KeyRotation,
    RotationBadSignature,
    RotationChainTooLong,
    RotationRefused,
    sign_rotation,
    verify_chain,
)

KEYS = [generate_keypair() for _ in range(MAX_CHAIN + 2)]


def _chain(retire: list[bool]) -> tuple[list[tuple[bytes, bytes]], list[list[bytes]]]:
    """Rotations 1..len(retire) as the control plane makes them (each signed by the key before it),
    and the key set trusted after each step (index 0: the enrolment key)."""
    trusted, links = [[KEYS[0].public_key]], []
    for sequence, retired in enumerate(retire, 1):
        new = KEYS[sequence].public_key
        keys = (new,) if retired else (new, *trusted[-1])[:MAX_KEYS]
        rotation = KeyRotation(keys=keys, sequence=sequence, issued_at=1_800_000_000 + sequence)
        links.append(sign_rotation(rotation, KEYS[sequence - 1].private_key))
        trusted.append(list(keys))
    return links, trusted


chains = st.lists(st.booleans(), min_size=1, max_size=MAX_CHAIN)


@settings(max_examples=60, deadline=None)
@given(retire=chains, data=st.data())
def test_a_device_catches_up_from_any_rotation_even_through_retired_keys(retire, data) -> None:
    links, trusted = _chain(retire)
    held = data.draw(st.integers(0, len(links) - 1), label="held sequence")
    taken = verify_chain(links[held:], trusted[held], held)
    assert [r.sequence for r in taken] == list(range(held + 1, len(links) + 1))
    assert list(taken[-1].keys) == trusted[-1]


@settings(max_examples=60, deadline=None)
@given(retire=chains.filter(lambda r: len(r) >= 2), data=st.data())
def test_a_chain_with_a_skipped_prefix_is_refused(retire, data) -> None:
    links, trusted = _chain(retire)
    held = data.draw(st.integers(0, len(links) - 2), label="held sequence")
    skipped = data.draw(st.integers(1, len(links) - held - 1), label="links skipped")
    with pytest.raises(RotationBadSignature, match="link 1 of"):
        verify_chain(links[held + skipped :], trusted[held], held)


@settings(max_examples=80, deadline=None)
@given(retire=chains, data=st.data())
def test_a_tampered_link_refuses_the_whole_chain(retire, data) -> None:
    links, trusted = _chain(retire)
    index = data.draw(st.integers(0, len(links) - 1), label="link")
    part = data.draw(st.integers(0, 1), label="rotation or signature")
    target = links[index][part]
    position = data.draw(st.integers(0, len(target) - 1), label="byte")
    flip = data.draw(st.integers(1, 255), label="xor")
    altered = bytearray(target)
    altered[position] ^= flip
    link = list(links[index])
    link[part] = bytes(altered)
    tampered = [*links[:index], tuple(link), *links[index + 1 :]]
    with pytest.raises(RotationRefused, match=f"link {index + 1} of"):
        verify_chain(tampered, trusted[0], 0)


@settings(max_examples=60, deadline=None)
@given(retire=chains.filter(lambda r: len(r) >= 2), data=st.data())
def test_reordered_links_are_refused(retire, data) -> None:
    links, trusted = _chain(retire)
    order = data.draw(st.permutations(range(len(links))).filter(lambda p: list(p) != sorted(p)))
    with pytest.raises(RotationRefused):
        verify_chain([links[i] for i in order], trusted[0], 0)


def test_a_chain_longer_than_the_bound_is_refused_even_when_every_link_verifies() -> None:
    links, trusted = _chain([False] * (MAX_CHAIN + 1))
    with pytest.raises(RotationChainTooLong, match="enrol it again") as refused:
        verify_chain(links, trusted[0], 0)
    assert refused.value.code == "chain_too_long"
    assert len(verify_chain(links[1:], trusted[1], 1)) == MAX_CHAIN  # the bound itself is fine


def test_an_empty_chain_changes_nothing() -> None:
    assert verify_chain([], [KEYS[0].public_key], 0) == []
