"""Truthful rollouts in deploy/: a phase selects ⌈p·N⌉ devices of a small fleet, stickily, and
the gate's arithmetic counts attempts and treats silence as pending, not health."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.gates import CohortFigures, GateThresholds, evaluate_gate
from deploy.phases import RolloutState, Status, Step, next_step, phases_from
from deploy.rollout import (
    DeviceFacts,
    PolicySet,
    ReleasePolicy,
    Target,
    bucket,
    includes,
    selected_count,
    selection_threshold,
)

percentages = st.floats(0.01, 100, allow_nan=False)
fleets = st.lists(st.uuids().map(str), min_size=0, max_size=60, unique=True)


def _selected(salt: str, device_ids: list[str], percentage: float) -> set[str]:
    """The devices a phase selects, through the same per-device check a check-in runs."""
    threshold = selection_threshold(percentage, [bucket(salt, d) for d in device_ids])
    policy = ReleasePolicy("r", "o", "v", "d", salt, Target(percentage=percentage, threshold=threshold))
    compiled = PolicySet([policy])
    chosen = {d for d in device_ids if includes(policy, DeviceFacts(d, "o"))}
    assert chosen == {d for d in device_ids if compiled.winner(DeviceFacts(d, "o")) is not None}
    return chosen


@given(salt=st.text(max_size=8), devices=fleets, low=percentages, high=percentages)
@settings(max_examples=300)
def test_a_phase_selects_the_ceiling_at_least_one_and_only_adds_devices(salt, devices, low, high):
    low, high = sorted((low, high))
    few, more = _selected(salt, devices, low), _selected(salt, devices, high)
    expected = math.ceil(round(low * len(devices) / 100, 9))
    assert (
        len(few) == min(len(devices), max(1 if devices else 0, expected)) == selected_count(low, len(devices))
    )
    assert few <= more  # raising p only adds devices (buckets never change)
    if few:  # the lowest buckets go first
        assert max(bucket(salt, d) for d in few) <= min(
            (bucket(salt, d) for d in set(devices) - few), default=100.0
        )
    assert _selected(salt, devices, low) == few  # sticky: the same answer every time


def test_a_one_percent_canary_of_three_devices_is_one_device():
    devices = ["a", "b", "c"]
    assert len(_selected("salt", devices, 1)) == 1
    assert len(_selected("salt", devices, 34)) == 2
    assert len(_selected("salt", devices, 100)) == 3
    assert selection_threshold(10, []) is None  # nobody matches: bucket < p decides meanwhile
    assert selected_count(0, 3) == 0


def test_a_full_phase_takes_devices_that_enrol_later():
    policy = ReleasePolicy("r", "o", "v", "d", "s", Target(percentage=100, threshold=100.0))
    assert includes(policy, DeviceFacts("newcomer", "o"))


counts = st.integers(0, 10**6)


@given(errors=counts, successes=counts)
def test_error_rate_is_errors_over_attempts(errors, successes):
    figures = CohortFigures(devices_reporting=1, inferences=successes, errors=errors)
    rate = figures.error_rate
    assert 0.0 <= rate <= 1.0
    if errors + successes:
        assert math.isclose(rate, errors / (errors + successes))
    else:
        assert rate == 0.0
    limit = 0.02
    failed = not evaluate_gate(GateThresholds(max_error_rate=limit), figures, None).passed
    assert failed == (rate > limit)


def test_half_the_attempts_failing_is_a_rate_of_one_half():
    assert CohortFigures(inferences=100, errors=100).error_rate == 0.5  # errors/inferences said 1.0


def test_a_gate_with_every_device_pending_waits_and_says_so():
    pending = CohortFigures(devices_reporting=0, devices_pending=3)
    result = evaluate_gate(GateThresholds(), pending, None)
    assert result.pending and not result.passed and not result.failures
    assert result.figures["devices_pending"] == 3
    phases = phases_from([{"percentage": 100, "min_reporting_devices": 0}])
    step = next_step(phases, RolloutState(Status.ACTIVE, 0), 10_000, result, "pause")
    assert step.step == Step.WAIT and "3 pending" in step.reason


@given(
    buckets=st.lists(st.floats(0, 99.99), min_size=1, max_size=40, unique=True),
    percentage=percentages,
    reached=st.integers(0, 5),
)
def test_a_growing_fleet_never_takes_the_version_back(buckets, percentage, reached):
    """Devices the release already reached stay at or below the threshold, whatever joins."""
    keep = sorted(buckets)[-reached:] if reached else []
    threshold = selection_threshold(percentage, buckets, keep=keep)
    assert all(b <= threshold for b in keep)
    selected = [b for b in buckets if b <= threshold]
    assert len(selected) >= selected_count(percentage, len(buckets))
    if not keep:
        assert len(selected) == selected_count(percentage, len(buckets)) or percentage >= 100
