"""Rollout targeting: stable buckets and the overlapping-release rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.errors import PolicyError
from deploy.rollout import DeviceFacts, ReleasePolicy, Target, bucket, desired_release, includes

ids = st.text(alphabet="0123456789abcdef-", min_size=1, max_size=36)


@given(salt=ids, device=ids, low=st.floats(0, 100), high=st.floats(0, 100))
@settings(max_examples=200)
def test_bucketing_is_stable_and_monotone(salt, device, low, high):
    low, high = sorted((low, high))
    assert bucket(salt, device) == bucket(salt, device)
    assert 0 <= bucket(salt, device) < 100
    policy = lambda p: ReleasePolicy("r", "o", "v", "d", salt, Target(percentage=p))  # noqa: E731
    facts = DeviceFacts(device, "o")
    if includes(policy(low), facts):
        assert includes(policy(high), facts)


def test_percentage_splits_a_fleet_roughly_evenly():
    policy = ReleasePolicy("r", "o", "v", "d", "salt", Target(percentage=10))
    share = sum(includes(policy, DeviceFacts(f"dev-{i}", "o")) for i in range(20_000)) / 20_000
    assert 0.09 < share < 0.11


def test_most_specific_target_wins_then_priority_then_newest():
    device = DeviceFacts("d1", "o", labels={"fleet": "demo"})
    fleet = ReleasePolicy("fleet", "o", "v1", "x", "s", Target(), priority=9, created_at=3)
    by_label = ReleasePolicy("label", "o", "v2", "x", "s", Target(labels={"fleet": "demo"}), created_at=1)
    by_list = ReleasePolicy("list", "o", "v3", "x", "s", Target(device_ids=frozenset({"d1"})), created_at=0)
    assert desired_release(device, [fleet, by_label, by_list]).release_id == "list"
    assert desired_release(device, [fleet, by_label]).release_id == "label"
    newer = ReleasePolicy("newer", "o", "v4", "x", "s", Target(labels={"fleet": "demo"}), created_at=2)
    assert desired_release(device, [by_label, newer]).release_id == "newer"
    higher = ReleasePolicy("higher", "o", "v5", "x", "s", Target(labels={"fleet": "demo"}), priority=1)
    assert desired_release(device, [by_label, newer, higher]).release_id == "higher"


def test_other_organisations_and_non_matching_devices_are_left_alone():
    policy = ReleasePolicy("r", "o", "v", "d", "s", Target(labels={"fleet": "demo"}))
    assert desired_release(DeviceFacts("d", "other", labels={"fleet": "demo"}), [policy]) is None
    assert desired_release(DeviceFacts("d", "o", labels={"fleet": "prod"}), [policy]) is None


def test_bad_percentage_is_a_policy_error():
    with pytest.raises(PolicyError, match="between 0 and 100"):
        Target(percentage=150)
