"""Staged phases and the release state machine, as pure functions.

A release walks through its phases (e.g. 1% → 10% → 50% → 100%). It leaves a phase
only when that phase's health gate has passed, the phase has soaked for its minimum
time (counted from the first report of a device the phase selected, not from the phase's
start: a phase nobody has reported from has not soaked) and at least its minimum number of
devices report; a phase marked
``manual_approval`` then waits for a person's ``advance``. A failing gate pauses or
aborts the release, as its thresholds say.

States and actions (every action is idempotent: repeating one that already took
effect changes nothing)::

    draft ──start──► active ──pause──► paused ──resume──► active
    active/paused ──advance──► next phase (after the last phase: completed)
    draft/active/paused ──abort──► aborted          (devices go back to what they ran before)
    active/paused/completed ──rollback──► rolled_back (the same, for a release that finished)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from deploy.errors import PolicyError
from deploy.gates import GateResult

MAX_PHASES = 20


class Status(StrEnum):
    DRAFT = "draft"
    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    ABORTED = "aborted"
    ROLLED_BACK = "rolled_back"


# action -> (statuses it may start from, status it leads to); "advance" is handled apart
TRANSITIONS: dict[str, tuple[frozenset[Status], Status]] = {
    "start": (frozenset({Status.DRAFT}), Status.ACTIVE),
    "pause": (frozenset({Status.ACTIVE}), Status.PAUSED),
    "resume": (frozenset({Status.PAUSED}), Status.ACTIVE),
    "abort": (frozenset({Status.DRAFT, Status.ACTIVE, Status.PAUSED}), Status.ABORTED),
    "rollback": (frozenset({Status.ACTIVE, Status.PAUSED, Status.COMPLETED}), Status.ROLLED_BACK),
}
ACTIONS = (*TRANSITIONS, "advance")
# releases whose devices are sent back to the version they ran before
ROLLING_BACK = frozenset({Status.ABORTED, Status.ROLLED_BACK})


class TransitionRefused(PolicyError):
    """The action cannot apply to the release's current state (e.g. resume an aborted release)."""


@dataclass(frozen=True)
class Phase:
    percentage: float
    min_soak_seconds: int = 0
    min_reporting_devices: int = 0
    manual_approval: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.percentage, bool) or not isinstance(self.percentage, int | float):
            raise PolicyError(f"phase percentage must be a number, got {self.percentage!r}")
        if not 0 <= self.percentage <= 100:
            raise PolicyError(f"phase percentage must be between 0 and 100, got {self.percentage}")
        for name in ("min_soak_seconds", "min_reporting_devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PolicyError(f"phase {name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.manual_approval, bool):
            raise PolicyError(f"phase manual_approval must be true or false, got {self.manual_approval!r}")

    def as_dict(self) -> dict:
        return {
            "percentage": self.percentage,
            "min_soak_seconds": self.min_soak_seconds,
            "min_reporting_devices": self.min_reporting_devices,
            "manual_approval": self.manual_approval,
        }


def phases_from(data: list | None, default_percentage: float = 100.0) -> tuple[Phase, ...]:
    """Validated phases; no phases means one phase at the target's percentage."""
    if not data:
        return (
            (Phase(percentage=default_percentage),) if default_percentage > 0 else (Phase(percentage=100.0),)
        )
    if not isinstance(data, list) or len(data) > MAX_PHASES:
        raise PolicyError(f"phases must be a list of at most {MAX_PHASES} objects")
    phases = []
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            raise PolicyError(f"phase {index + 1} must be an object")
        unknown = set(item) - {"percentage", "min_soak_seconds", "min_reporting_devices", "manual_approval"}
        if unknown:
            raise PolicyError(f"phase {index + 1}: unknown field(s) {', '.join(sorted(unknown))}")
        if "percentage" not in item:
            raise PolicyError(f"phase {index + 1} needs a percentage")
        try:
            phases.append(Phase(**item))
        except PolicyError as exc:
            raise PolicyError(f"phase {index + 1}: {exc}") from None
    for earlier, later in zip(phases, phases[1:], strict=False):
        if later.percentage <= earlier.percentage:
            raise PolicyError(f"phase percentages must grow: {later.percentage} follows {earlier.percentage}")
    return tuple(phases)


@dataclass(frozen=True)
class RolloutState:
    status: Status
    phase: int = 0  # index into the phases


def transition(
    state: RolloutState, action: str, phase_count: int, from_phase: int | None = None
) -> RolloutState:
    """The state after a person's (or the gate's) action; the same state when it already took effect.

    ``advance`` with ``from_phase`` is idempotent: it only leaves that phase, so two people
    advancing at once move the release one phase, not two.
    """
    if action == "advance":
        return _advance(state, phase_count, from_phase)
    if action not in TRANSITIONS:
        raise PolicyError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    sources, destination = TRANSITIONS[action]
    if state.status == destination:
        return state
    if state.status not in sources:
        raise TransitionRefused(f"Cannot {action} a release that is {state.status.value}.")
    return RolloutState(destination, state.phase)


def _advance(state: RolloutState, phase_count: int, from_phase: int | None) -> RolloutState:
    if from_phase is not None and (state.phase > from_phase or state.status == Status.COMPLETED):
        return state  # someone already moved it on
    if state.status not in (Status.ACTIVE, Status.PAUSED):
        raise TransitionRefused(f"Cannot advance a release that is {state.status.value}.")
    if from_phase is not None and from_phase != state.phase:
        raise TransitionRefused(
            f"Cannot advance from phase {from_phase + 1}: the release is in phase {state.phase + 1}."
        )
    if state.phase + 1 >= phase_count:
        return RolloutState(Status.COMPLETED, state.phase)
    return RolloutState(state.status, state.phase + 1)


class Step(StrEnum):
    WAIT = "wait"  # not enough soak time or reporting devices yet
    ADVANCE = "advance"
    COMPLETE = "complete"  # the last phase passed: advance leads to completed
    AWAIT_APPROVAL = "await_approval"  # the gate passed; the phase wants a person to advance
    PAUSE = "pause"
    ABORT = "abort"


@dataclass(frozen=True)
class StepDecision:
    step: Step
    reason: str


def next_step(
    phases: tuple[Phase, ...],
    state: RolloutState,
    soaked_seconds: float,
    gate: GateResult,
    on_failure: str,
) -> StepDecision:
    """What the periodic gate evaluation does with an active release.

    ``soaked_seconds`` runs from the phase's first device report, not from the phase's start
    (the control plane measures it so): a phase whose devices have not reported has not
    soaked. A pending gate (no selected device has reported) waits. The last phase completes
    only when no online selected device is still deciding (``devices_unsettled`` in the gate's
    figures): once completed, the gate stops looking, so a refusal arriving later would abort
    nothing.
    """
    if state.status != Status.ACTIVE:
        return StepDecision(Step.WAIT, f"release is {state.status.value}")
    phase = phases[state.phase]
    reporting = gate.figures.get("devices_reporting", 0)
    needed = max(1, phase.min_reporting_devices)
    if reporting < needed or gate.pending:
        pending = gate.figures.get("devices_pending", 0)
        suffix = f", {pending} pending" if pending else ""
        return StepDecision(Step.WAIT, f"{reporting} of {needed} devices reporting{suffix}")
    if not gate.passed:  # enough evidence of harm: act at once, do not wait out the soak
        step = Step.ABORT if on_failure == "abort" else Step.PAUSE
        return StepDecision(step, "health gate failed: " + "; ".join(gate.failures))
    if soaked_seconds < phase.min_soak_seconds:
        return StepDecision(Step.WAIT, f"soaked {soaked_seconds:.0f} of {phase.min_soak_seconds} s")
    if phase.manual_approval:
        return StepDecision(
            Step.AWAIT_APPROVAL, f"phase {state.phase + 1} passed its gate; awaiting approval"
        )
    if state.phase + 1 >= len(phases):
        unsettled = gate.figures.get("devices_unsettled", 0)
        if unsettled:  # a refusal still on its way would find the release completed: wait for it
            return StepDecision(
                Step.WAIT,
                f"last phase passed its gate; {unsettled} online device(s) have not installed or "
                "refused the version yet (advance by hand to complete now)",
            )
        return StepDecision(Step.COMPLETE, "last phase passed its gate")
    return StepDecision(Step.ADVANCE, f"phase {state.phase + 1} passed its gate")
