"""A staged rollout over 100,000 simulated devices, with Ferry's own policy code (deploy/).

Two releases run one after the other over the same fleet:

1. a healthy version goes 1% → 10% → 50% → 100% as its health gate passes each phase;
2. a faulty version (8% inference errors instead of 0.5%) starts at 1%; its gate trips,
   the release aborts, and the devices that had it roll back to the version they ran before.

Each tick is five simulated minutes: every device checks in (PolicySet.decide), installs
what it is offered, and reports a tick's metrics; then the gate compares the release's
devices with the rest (deploy.gates) and the phase logic acts (deploy.phases). No real
agents, no database. It prints the timeline and the wall time.

    .venv/bin/python bench/rollout_sim.py [--devices 100000] [--seed 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rollout_fleet import make_device  # noqa: E402
from deploy.filters import Filter  # noqa: E402
from deploy.gates import CohortFigures, GateThresholds, evaluate_gate  # noqa: E402
from deploy.phases import RolloutState, Status, Step, next_step, phases_from, transition  # noqa: E402
from deploy.rollout import (  # noqa: E402
    PolicySet,
    ReleasePolicy,
    Target,
    VersionRef,
    bucket,
    matches,
    selection_threshold,
)

TICK_SECONDS = 300
VERSIONS = {"v1": (0.005, 20.0), "v2": (0.005, 19.0), "v3": (0.08, 21.0)}  # error rate, p95 ms
PHASES = [
    {"percentage": p, "min_soak_seconds": 600, "min_reporting_devices": n}
    for p, n in ((1, 100), (10, 1000), (50, 5000), (100, 10000))
]


class Fleet:
    def __init__(self, count: int, seed: int) -> None:
        rng = random.Random(seed)
        self.facts = [make_device(rng, i) for i in range(count)]
        self.running = ["v1"] * count
        self.previous: list[dict[str, VersionRef | None]] = [{} for _ in range(count)]
        self.np_rng = np.random.default_rng(seed)

    def check_in(self, policies: list[ReleasePolicy]) -> int:
        """Every device asks what to run and installs it; returns how many switched."""
        policy_set = PolicySet(policies)
        switched = 0
        for i, facts in enumerate(self.facts):
            facts = replace(facts, running_version_id=self.running[i], previous_versions=self.previous[i])
            decision = policy_set.decide(facts)
            if decision is None or decision.version_id == self.running[i]:
                continue
            if not decision.rollback and decision.release_id not in self.previous[i]:
                # the version history the control plane keeps: what ran before this release arrived
                self.previous[i] = {**self.previous[i], decision.release_id: VersionRef(self.running[i], "")}
            self.running[i] = decision.version_id
            switched += 1
        return switched

    def report(self, version: str) -> tuple[CohortFigures, CohortFigures]:
        """One tick of metrics: the release's devices, and the devices on any other version."""
        running = np.array(self.running)
        cohorts = []
        for mask in (running == version, running != version):
            devices = int(mask.sum())
            errors = inferences = 0
            p95 = []
            for v, (error_rate, latency) in VERSIONS.items():
                n = int((mask & (running == v)).sum())
                if n == 0:
                    continue
                failed = int(self.np_rng.binomial(100, error_rate, size=n).sum())
                errors += failed
                inferences += 100 * n - failed  # as the agent counts: successes only
                p95.append(self.np_rng.normal(latency, 2.0, size=n))  # each device's p95 figure
            median_p95 = float(np.median(np.concatenate(p95))) if p95 else None
            cohorts.append(
                CohortFigures(
                    devices_reporting=devices,
                    activations=devices,
                    inferences=inferences,
                    errors=errors,
                    latency_ms_p95=median_p95,
                )
            )
        return cohorts[0], cohorts[1]

    def threshold(self, policy: ReleasePolicy, percentage: float) -> float | None:
        """The phase's bucket threshold over the matching devices, as the control plane stores it."""
        buckets = [bucket(policy.salt, f.device_id) for f in self.facts if matches(policy.target, f)]
        return selection_threshold(percentage, buckets)

    def spread(self) -> str:
        values, counts = np.unique(np.array(self.running), return_counts=True)
        return " ".join(f"{v}={c}" for v, c in zip(values, counts, strict=True))


def _figure(value: float | None, digits: int) -> str:
    """A gate figure, or a dash where there was nothing to compare with."""
    return f"{'–':>9}" if value is None else f"{value:>9.{digits}f}"


def run_release(
    fleet: Fleet, policy: ReleasePolicy, others: list[ReleasePolicy], clock: list[float]
) -> Status:
    phases = phases_from(PHASES)
    thresholds = GateThresholds(max_error_rate=0.02, max_latency_p95_ratio=1.5, on_failure="abort")
    state = transition(RolloutState(Status.DRAFT), "start", len(phases))
    phase_started = clock[0]
    print(
        f"\n== release {policy.release_id}: version {policy.version_id}, "
        f"target: {policy.target.filter.text if policy.target.filter else 'whole fleet'}"
    )
    print(
        f"{'t (min)':>7} {'phase':>5} {'pct':>5} {'devices per version':<28} {'on rel.':>8} "
        f"{'err rate':>9} {'base err':>9} {'p95 ratio':>9}  step"
    )
    thresholds_by_phase: dict[int, float | None] = {}
    while True:
        percentage, phase_number = phases[state.phase].percentage, state.phase + 1
        if state.phase not in thresholds_by_phase:  # computed when the phase starts
            thresholds_by_phase[state.phase] = fleet.threshold(policy, percentage)
        target = replace(policy.target, percentage=percentage, threshold=thresholds_by_phase[state.phase])
        current = replace(policy, status=state.status.value, target=target)
        fleet.check_in([current, *others])
        clock[0] += TICK_SECONDS
        treated, baseline = fleet.report(policy.version_id)
        gate = evaluate_gate(thresholds, treated, baseline)
        if state.status in (Status.ABORTED, Status.COMPLETED):
            step_text = "rolled back" if state.status == Status.ABORTED else "done"
        else:
            decision = next_step(phases, state, clock[0] - phase_started, gate, thresholds.on_failure)
            step_text = f"{decision.step.value}: {decision.reason}"
            if decision.step in (Step.ADVANCE, Step.COMPLETE):
                state = transition(state, "advance", len(phases), state.phase)
                phase_started = clock[0]
            elif decision.step in (Step.ABORT, Step.PAUSE):
                state = transition(state, decision.step.value, len(phases))
        f = gate.figures
        print(
            f"{clock[0] / 60:>7.0f} {phase_number:>5} {percentage:>5g} {fleet.spread():<28} "
            f"{treated.devices_reporting:>8} {f['error_rate']:>9.4f} {_figure(f['baseline_error_rate'], 4)} "
            f"{_figure(f['latency_p95_ratio'], 3)}  {step_text}"
        )
        if step_text in ("done", "rolled back"):
            return state.status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    fleet = Fleet(args.devices, args.seed)
    print(f"{args.devices} simulated devices built in {time.perf_counter() - started:.1f} s")
    clock = [0.0]
    healthy = ReleasePolicy("healthy-v2", "org", "v2", "sha-v2", "salt-healthy", Target(), created_at=1.0)
    outcome = run_release(fleet, healthy, [], clock)
    assert outcome == Status.COMPLETED and fleet.spread() == f"v2={args.devices}", fleet.spread()
    done_healthy = replace(healthy, status=Status.COMPLETED.value)
    faulty = ReleasePolicy(
        "faulty-v3",
        "org",
        "v3",
        "sha-v3",
        "salt-faulty",
        Target(filter=Filter.parse("ram_mb >= 1024")),
        created_at=2.0,
    )
    outcome = run_release(fleet, faulty, [done_healthy], clock)
    on_v3 = sum(v == "v3" for v in fleet.running)
    print(f"\nfaulty release ended {outcome.value}; devices still on v3: {on_v3}; spread: {fleet.spread()}")
    assert outcome == Status.ABORTED and on_v3 == 0
    print(f"wall time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
