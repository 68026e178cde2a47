"""How long deciding one checking-in device's desired version takes, with N active releases.

Ferry's PolicySet (releases ranked once; each device stops at the first release that
covers it) is measured side by side with the naive approach its predecessor used
(test every release, then take the maximum). Pure deploy/ code, no database.

    .venv/bin/python bench/rollout_decide.py [--releases 50] [--devices 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rollout_fleet import make_device, make_releases  # noqa: E402
from deploy.rollout import PolicySet, ReleasePolicy, covers  # noqa: E402


def with_threshold(policy: ReleasePolicy) -> ReleasePolicy:
    """The release as the control plane serves it once started: with its stored threshold (here the
    percentage itself, the large-fleet limit of the ⌈p·N⌉-th smallest bucket)."""
    return replace(policy, target=replace(policy.target, threshold=policy.target.percentage))


def naive(device, releases):
    candidates = [r for r in releases if covers(r, device)]
    return max(candidates, key=lambda r: r.rank) if candidates else None


def measure(fn, devices) -> list[float]:
    timings = []
    clock = time.perf_counter_ns
    for device in devices:
        start = clock()
        fn(device)
        timings.append((clock() - start) / 1000)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=50)
    parser.add_argument("--devices", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(5)
    # started releases carry the phase threshold the control plane computed from the matching
    # devices (deploy/rollout.py): the check-in compares each bucket with it
    releases = [with_threshold(r) for r in make_releases(args.releases, rng)]
    devices = [make_device(rng, i) for i in range(args.devices)]
    policy_set = PolicySet(releases)
    for device in devices[:1000]:  # the same answer both ways, and warm caches
        assert naive(device, releases) == policy_set.winner(device)
    rows = [
        ("Ferry PolicySet.decide", measure(policy_set.decide, devices)),
        ("naive: test all, take max", measure(lambda d: naive(d, releases), devices)),
    ]
    print(f"{args.releases} releases (mixed targets and states), {args.devices} devices")
    print(f"{'approach':<28} {'median µs':>10} {'p95 µs':>10} {'p99 µs':>10}")
    for name, timings in rows:
        q = statistics.quantiles(timings, n=100)
        print(f"{name:<28} {statistics.median(timings):>10.1f} {q[94]:>10.1f} {q[98]:>10.1f}")
    decided = sum(policy_set.decide(d) is not None for d in devices)
    print(f"devices with a desired version: {decided} of {len(devices)}")


if __name__ == "__main__":
    main()
