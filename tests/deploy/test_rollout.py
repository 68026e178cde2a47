"""Rollout targeting: stable buckets and the overlapping-release rule."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.errors import PolicyError
from deploy.filters import Filter
from deploy.rollout import (
    Decision,
    DeviceFacts,
    PolicySet,
    ReleasePolicy,
    Target,
    VersionRef,
    bucket,
    covers,
    decide,
    desired_release,
    includes,
)
from deploy.windows import MaintenanceWindow

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


# --- filters, groups, states, pins, rollbacks ---------------------------------------------------


PI = DeviceFacts("d1", "o", attributes={"hardware": "rpi4", "ram_mb": "4096"}, labels={"site": "lab"})


def _policy(release_id, target: Target | None = None, **extra):
    return ReleasePolicy(
        release_id, "o", f"v-{release_id}", f"sha-{release_id}", "salt", target or Target(), **extra
    )


def test_filter_targets_and_dynamic_groups_pick_devices_that_appear_later():
    by_filter = _policy("f", Target(filter=Filter.parse("hardware == rpi4 and ram_mb >= 2048")))
    assert decide(PI, [by_filter]).version_id == "v-f"
    small = DeviceFacts("d2", "o", attributes={"hardware": "rpi4", "ram_mb": "512"})
    assert decide(small, [by_filter]) is None
    dynamic = _policy(
        "g", Target(group_ids=frozenset({"g1"}), group_filters={"g1": Filter.parse("site == lab")})
    )
    newcomer = DeviceFacts("d-new", "o", labels={"site": "lab"})
    assert decide(newcomer, [dynamic]).release_id == "g"
    static = _policy("s", Target(group_ids=frozenset({"g2"})))
    assert decide(DeviceFacts("d3", "o", group_ids=frozenset({"g2"})), [static]).release_id == "s"
    assert decide(DeviceFacts("d4", "o"), [static]) is None


def test_target_parts_combine_with_and():
    target = Target(device_ids=frozenset({"d1", "d9"}), filter=Filter.parse("hardware == rpi4"))
    assert decide(PI, [_policy("r", target)]) is not None
    assert decide(DeviceFacts("d9", "o", attributes={"hardware": "x86"}), [_policy("r", target)]) is None


def test_paused_release_keeps_only_devices_that_run_it_and_draft_has_no_say():
    paused = _policy("p", status="paused")
    assert decide(PI, [paused]) is None
    running = DeviceFacts("d1", "o", running_version_id="v-p")
    assert decide(running, [paused]).version_id == "v-p"
    assert decide(PI, [_policy("d", status="draft")]) is None


def test_paused_release_holds_the_devices_it_reached_and_spreads_no_further():
    """Pause means "stop spreading", not "go back": a device the release reached (it ran the
    release's version since the release started) keeps that version even after a pin took it
    away and was lifted; a device in the phase it never reached gets nothing from it, so an
    older release decides for that one."""
    older = ReleasePolicy("older", "o", "v-old", "sha-old", "s", Target(), created_at=-1)
    paused = _policy("p", Target(percentage=100), status="paused")
    unpinned = DeviceFacts("d1", "o", running_version_id="v-old", reached_by=frozenset({"p"}))
    assert decide(unpinned, [older, paused]).release_id == "p"
    assert decide(unpinned, [older, paused]).version_id == "v-p"
    still_pinned = replace(unpinned, pin=VersionRef("v-old", "sha-old"))
    assert decide(still_pinned, [older, paused]).reason == "pin"
    never_reached = DeviceFacts("d2", "o", running_version_id="v-old")
    assert decide(never_reached, [older, paused]).release_id == "older"
    assert decide(never_reached, [paused]) is None
    # the phases reached so far bound it: a device outside them is not held, whatever it ran
    outside = _policy("p", Target(percentage=100, device_ids=frozenset({"d9"})), status="paused")
    assert decide(unpinned, [older, outside]).release_id == "older"
    # once resumed it spreads again; aborted, the devices it moved go back (previous_versions)
    assert decide(never_reached, [older, replace(paused, status="active")]).release_id == "p"
    aborted = replace(paused, status="aborted")
    moved = DeviceFacts(
        "d1", "o", running_version_id="v-p", previous_versions={"p": VersionRef("v-old", "sha-old")}
    )
    assert decide(moved, [older, aborted]) == Decision(
        "v-old", "sha-old", "p", rollback=True, reason="rollback"
    )


def test_aborted_release_sends_its_devices_back_to_what_they_ran():
    before = VersionRef("v-old", "sha-old")
    aborted = _policy("a", status="aborted")
    reached = DeviceFacts("d1", "o", running_version_id="v-a", previous_versions={"a": before})
    assert decide(reached, [aborted]) == Decision("v-old", "sha-old", "a", rollback=True, reason="rollback")
    never_reached = DeviceFacts("d2", "o", running_version_id="v-old")
    assert decide(never_reached, [aborted]) is None
    back = DeviceFacts("d1", "o", running_version_id="v-old", previous_versions={"a": before})
    older = _policy("older", created_at=-1)
    assert decide(back, [aborted, older]).release_id == "older"  # once back, the other releases decide
    had_nothing = DeviceFacts("d3", "o", running_version_id="v-a", previous_versions={"a": None})
    assert decide(had_nothing, [aborted]) is None


def test_pins_win_over_every_release():
    pinned = DeviceFacts("d1", "o", pin=VersionRef("v-pin", "sha-pin"))
    decision = decide(pinned, [_policy("r", Target(device_ids=frozenset({"d1"})), priority=99)])
    assert decision.version_id == "v-pin" and decision.reason == "pin" and decision.release_id == ""


def test_download_only_and_windows_travel_with_the_offer():
    window = MaintenanceWindow("0 2 * * *", 3600, "UTC")
    decision = decide(PI, [_policy("r", download_only=True, window=window)])
    assert decision.download_only and decision.window == window
    group_window = MaintenanceWindow("0 3 * * 6", 7200, "Europe/Paris")
    in_group = DeviceFacts("d1", "o", window=group_window)
    assert decide(in_group, [_policy("r")]).window == group_window  # the release's own window comes first
    assert decide(in_group, [_policy("r", window=window)]).window == window


policies = st.lists(
    st.builds(
        ReleasePolicy,
        release_id=st.text("abcdef", min_size=1, max_size=4),
        organisation_id=st.just("o"),
        version_id=st.sampled_from(["v1", "v2", "v3"]),
        package_digest=st.just("x"),
        salt=st.text("xyz", max_size=3),
        target=st.builds(
            Target,
            device_ids=st.frozensets(st.sampled_from(["d1", "d2"]), max_size=1),
            group_ids=st.frozensets(st.sampled_from(["g1", "g2"]), max_size=1),
            labels=st.dictionaries(st.just("site"), st.sampled_from(["lab", "prod"]), max_size=1),
            percentage=st.floats(0, 100),
            filter=st.sampled_from([None, Filter.parse("hw == a"), Filter.parse("site == lab or hw exists")]),
            threshold=st.one_of(st.none(), st.floats(-1, 100)),  # a computed phase threshold, or none
        ),
        priority=st.integers(0, 2),
        created_at=st.floats(0, 5),
        status=st.sampled_from(["active", "paused", "completed", "aborted", "rolled_back", "draft"]),
    ),
    max_size=8,
    unique_by=lambda p: p.release_id,
)
devices = st.builds(
    DeviceFacts,
    device_id=st.sampled_from(["d1", "d2", "d3"]),
    organisation_id=st.just("o"),
    labels=st.dictionaries(st.just("site"), st.sampled_from(["lab", "prod"]), max_size=1),
    attributes=st.dictionaries(st.just("hw"), st.sampled_from(["a", "b"]), max_size=1),
    group_ids=st.frozensets(st.sampled_from(["g1", "g2"]), max_size=2),
    running_version_id=st.sampled_from(["", "v1", "v2"]),
    previous_versions=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4), st.just(VersionRef("v0", "y"))
    ),
    reached_by=st.frozensets(st.text("abcdef", min_size=1, max_size=4), max_size=3),
)


@given(device=devices, releases=policies, order=st.randoms())
@settings(max_examples=300)
def test_a_device_gets_one_answer_per_release_state(device, releases, order):
    """However the releases are listed, and however often it asks, a device gets the same version."""
    first = decide(device, releases)
    shuffled = list(releases)
    order.shuffle(shuffled)
    assert decide(device, shuffled) == first == PolicySet(releases).decide(device)
    # the compiled check-in path agrees with the reference rules
    reference = max((p for p in releases if covers(p, device)), key=lambda p: p.rank, default=None)
    assert PolicySet(shuffled).winner(device) == reference
    if first is not None and not first.rollback:
        winner = next(p for p in releases if p.release_id == first.release_id)
        assert first.version_id == winner.version_id
        assert all(
            p.rank <= winner.rank
            for p in releases
            if p.status in ("active", "completed") and includes(p, device)
        )
