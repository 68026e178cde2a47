"""Staged phases, the state machine, health gates and maintenance windows (pure deploy/)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.errors import PolicyError
from deploy.gates import CohortFigures, GateResult, GateThresholds, drift, evaluate_gate
from deploy.phases import (
    ACTIONS,
    Phase,
    RolloutState,
    Status,
    Step,
    TransitionRefused,
    next_step,
    phases_from,
    transition,
)
from deploy.windows import MaintenanceWindow

FOUR = phases_from(
    [
        {"percentage": 1, "min_soak_seconds": 60, "min_reporting_devices": 2},
        {"percentage": 10, "min_soak_seconds": 60, "min_reporting_devices": 5},
        {"percentage": 50, "min_soak_seconds": 60, "min_reporting_devices": 20, "manual_approval": True},
        {"percentage": 100, "min_soak_seconds": 60, "min_reporting_devices": 50},
    ]
)


def gate(passed: bool, reporting: int) -> GateResult:
    return GateResult(
        passed, () if passed else ("inference error rate 0.2 > 0.02",), {"devices_reporting": reporting}
    )


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 100), st.floats(0, 200), st.sampled_from(["pause", "abort"])),
        max_size=40,
    )
)
@settings(max_examples=300)
def test_phase_transitions_never_skip_a_gate(ticks):
    """Drive the gate loop with random evidence: a phase is only left through a passed gate."""
    state = RolloutState(Status.ACTIVE, 0)
    for passed, reporting, soaked, on_failure in ticks:
        decision = next_step(FOUR, state, soaked, gate(passed, reporting), on_failure)
        phase = FOUR[state.phase]
        if decision.step in (Step.ADVANCE, Step.COMPLETE, Step.AWAIT_APPROVAL):
            assert (
                passed
                and soaked >= phase.min_soak_seconds
                and reporting >= max(1, phase.min_reporting_devices)
            )
        if decision.step in (Step.ADVANCE, Step.COMPLETE):
            assert not phase.manual_approval
            after = transition(state, "advance", len(FOUR), state.phase)
            assert after.phase - state.phase <= 1  # never two phases at once
            state = after
        elif decision.step == Step.AWAIT_APPROVAL:
            state = transition(state, "advance", len(FOUR), state.phase)  # a person approves
        elif decision.step in (Step.PAUSE, Step.ABORT):
            assert not passed
            assert decision.step.value == on_failure
            state = transition(state, decision.step.value, len(FOUR))
            break
        if state.status == Status.COMPLETED:
            break


@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.one_of(st.none(), st.integers(0, 4))), max_size=30))
@settings(max_examples=300)
def test_state_machine_is_idempotent_and_closed(actions):
    state = RolloutState(Status.DRAFT, 0)
    for action, from_phase in actions:
        try:
            after = transition(state, action, len(FOUR), from_phase)
        except TransitionRefused as exc:
            assert "Cannot" in str(exc)
            continue
        assert after.phase in (state.phase, state.phase + 1)
        assert after.phase < len(FOUR)
        if action != "advance" or from_phase is not None:
            assert transition(after, action, len(FOUR), from_phase) == after  # repeating changes nothing
        if state.status in (Status.ABORTED, Status.ROLLED_BACK):
            assert after == state  # the end of the road
        state = after


def test_two_advances_of_the_same_phase_move_one_phase():
    state = RolloutState(Status.ACTIVE, 1)
    once = transition(state, "advance", 4, from_phase=1)
    assert transition(once, "advance", 4, from_phase=1) == once == RolloutState(Status.ACTIVE, 2)
    last = transition(RolloutState(Status.ACTIVE, 3), "advance", 4, from_phase=3)
    assert last == RolloutState(Status.COMPLETED, 3)


def test_the_last_phase_completes_only_when_no_online_device_is_still_deciding():
    last = RolloutState(Status.ACTIVE, 3)
    deciding = GateResult(True, (), {"devices_reporting": 60, "devices_unsettled": 2})
    decision = next_step(FOUR, last, 3600, deciding, "pause")
    assert decision.step == Step.WAIT and "2 online device(s)" in decision.reason
    settled = GateResult(True, (), {"devices_reporting": 60, "devices_unsettled": 0})
    assert next_step(FOUR, last, 3600, settled, "pause").step == Step.COMPLETE
    # an earlier phase advances regardless: the next phase's gate still counts those devices
    earlier = next_step(FOUR, RolloutState(Status.ACTIVE, 1), 3600, deciding, "pause")
    assert earlier.step == Step.ADVANCE


def test_impossible_transitions_are_refused_with_the_reason():
    with pytest.raises(TransitionRefused, match="Cannot resume a release that is aborted"):
        transition(RolloutState(Status.ABORTED, 0), "resume", 1)
    with pytest.raises(TransitionRefused, match="Cannot advance a release that is draft"):
        transition(RolloutState(Status.DRAFT, 0), "advance", 2)
    with pytest.raises(PolicyError, match="unknown action"):
        transition(RolloutState(Status.ACTIVE, 0), "explode", 1)


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        ([{"percentage": 10}, {"percentage": 5}], "must grow"),
        ([{"percentage": 150}], "between 0 and 100"),
        ([{"percentage": 10, "soak": 5}], "unknown field"),
        ([{"min_soak_seconds": 5}], "needs a percentage"),
        ([{"percentage": 10, "min_soak_seconds": -1}], "min_soak_seconds"),
        (["10%"], "must be an object"),
    ],
)
def test_malformed_phases(phases, message):
    with pytest.raises(PolicyError, match=message):
        phases_from(phases)


def test_no_phases_is_one_phase_at_the_target_percentage():
    assert phases_from([], 25.0) == (Phase(25.0),)


def test_gate_compares_with_the_previous_version():
    baseline = CohortFigures(
        devices_reporting=90,
        inferences=10_000,
        errors=10,
        latency_ms_p95=10.0,
        top1_histogram={"0": 50, "1": 50},
    )
    healthy = CohortFigures(
        devices_reporting=10,
        activations=10,
        inferences=1000,
        errors=1,
        latency_ms_p95=11.0,
        top1_histogram={"0": 48, "1": 52},
    )
    faulty = CohortFigures(
        devices_reporting=10,
        activations=10,
        activation_failures=2,
        inferences=1000,
        errors=300,
        latency_ms_p95=30.0,
        restarts=40,
        top1_histogram={"1": 100},
    )
    thresholds = GateThresholds(max_drift=0.3)
    ok = evaluate_gate(thresholds, healthy, baseline)
    assert ok.passed and ok.figures["latency_p95_ratio"] == 1.1
    bad = evaluate_gate(thresholds, faulty, baseline)
    assert not bad.passed
    assert [f.split(" ")[0] for f in bad.failures] == ["activation", "inference", "p95", "restarts", "output"]
    assert bad.figures["drift"] == 0.5


def test_gate_without_a_baseline_checks_only_absolute_figures():
    result = evaluate_gate(
        GateThresholds(),
        CohortFigures(devices_reporting=3, inferences=100, latency_ms_p95=99.0),
        CohortFigures(),
    )
    assert result.passed and result.figures["latency_p95_ratio"] is None
    assert drift({}, {"a": 1}) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"max_error_rate": -1}, "max_error_rate"),
        ({"on_failure": "explode"}, "on_failure"),
        ({"max_errors": 1}, "unknown gate field"),
        ({"max_drift": "high"}, "max_drift"),
    ],
)
def test_malformed_gates(data, message):
    with pytest.raises(PolicyError, match=message):
        GateThresholds.from_dict(data)


def test_maintenance_window_in_its_time_zone():
    window = MaintenanceWindow(
        "0 2 * * *", 7200, "Europe/Berlin"
    )  # 02:00-04:00 Berlin = 00:00-02:00 UTC (CEST: -2)
    assert window.is_open(datetime(2026, 7, 1, 0, 30, tzinfo=UTC))
    assert window.is_open(datetime(2026, 7, 1, 0, 0, tzinfo=UTC))  # opens on the minute
    assert not window.is_open(datetime(2026, 7, 1, 2, 0, tzinfo=UTC))
    assert not window.is_open(datetime(2026, 7, 1, 12, 0, tzinfo=UTC))
    assert window.next_opening(datetime(2026, 7, 1, 12, 0, tzinfo=UTC)) == datetime(
        2026, 7, 2, 0, 0, tzinfo=UTC
    )
    assert MaintenanceWindow.from_dict(window.as_dict()) == window


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cron": "every night", "duration_seconds": 600}, "cron"),
        ({"cron": "0 2 * * *", "duration_seconds": 5}, "duration_seconds"),
        ({"cron": "0 2 * * *", "duration_seconds": 600, "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "0 2 * * *", "duration_seconds": 600, "tz": "UTC"}, "unknown window field"),
    ],
)
def test_malformed_windows(data, message):
    with pytest.raises(PolicyError, match=message):
        MaintenanceWindow.from_dict(data)
