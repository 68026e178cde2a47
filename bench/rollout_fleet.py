"""Shared by the rollout benchmarks: a varied synthetic fleet and a mix of releases (pure deploy/)."""

from __future__ import annotations

import random

from deploy.filters import Filter
from deploy.rollout import DeviceFacts, ReleasePolicy, Target, VersionRef

HARDWARE = ["rpi4", "rpi5", "jetson-nano", "jetson-orin", "x86-nuc", "imx8"]
OS = ["linux-5.15", "linux-6.1", "linux-6.6", "android-13"]
REGIONS = ["eu-west", "eu-north", "us-east", "us-west", "ap-south", "ap-east"]
FEATURES = ["neon", "avx2", "avx512", "sve", "fp16", "dotprod"]
GROUPS = [f"group-{i}" for i in range(20)]


def make_device(rng: random.Random, index: int, organisation_id: str = "org") -> DeviceFacts:
    features = ",".join(sorted(rng.sample(FEATURES, rng.randint(1, 3))))
    attributes = {
        "hardware": rng.choice(HARDWARE),
        "os": rng.choice(OS),
        "cpu_features": features,
        "ram_mb": str(rng.choice([512, 1024, 2048, 4096, 8192])),
        "app_version": f"{rng.randint(1, 3)}.{rng.randint(0, 9)}.{rng.randint(0, 20)}",
        "region": rng.choice(REGIONS),
    }
    labels = {
        "site": f"site-{rng.randint(0, 49)}",
        "tier": rng.choice(["canary", "beta", "prod", "prod", "prod"]),
    }
    groups = frozenset(rng.sample(GROUPS, rng.randint(0, 2)))
    return DeviceFacts(
        f"dev-{index:07d}", organisation_id, attributes, labels, groups, running_version_id="v-base"
    )


FILTERS = [
    "hardware == rpi4 and ram_mb >= 2048",
    "region in [eu-west, eu-north] and cpu_features has neon",
    'app_version matches ">=2.0.0,<3" and os != android-13',
    "tier == canary or labels.site == site-7",
    "not (hardware in [jetson-nano, imx8]) and ram_mb > 1024",
]


def make_releases(count: int, rng: random.Random, organisation_id: str = "org") -> list[ReleasePolicy]:
    """A mix of every target kind and state, like a busy organisation's release list."""
    releases = []
    for i in range(count):
        kind = i % 5
        target: Target
        if kind == 0:
            target = Target(percentage=rng.choice([1, 10, 50, 100]))
        elif kind == 1:
            target = Target(
                filter=Filter.parse(FILTERS[i % len(FILTERS)]), percentage=rng.choice([10, 50, 100])
            )
        elif kind == 2:
            static = frozenset(rng.sample(GROUPS, 2))
            dynamic = {f"dyn-{i}": Filter.parse(FILTERS[(i + 1) % len(FILTERS)])}
            target = Target(group_ids=static | set(dynamic), group_filters=dynamic, percentage=50)
        elif kind == 3:
            ids = frozenset(f"dev-{rng.randrange(100_000):07d}" for _ in range(200))
            target = Target(device_ids=ids)
        else:
            target = Target(labels={"tier": rng.choice(["canary", "beta"])}, percentage=100)
        status = "active" if i % 7 else rng.choice(["paused", "aborted", "completed"])
        releases.append(
            ReleasePolicy(
                release_id=f"rel-{i:03d}",
                organisation_id=organisation_id,
                version_id=f"v-{i}",
                package_digest=f"digest-{i}",
                salt=f"salt-{i}",
                target=target,
                priority=rng.randint(0, 3),
                created_at=float(i),
                status=status,
            )
        )
    return releases


BASE = VersionRef("v-base", "digest-base")
