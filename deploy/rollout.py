"""Which release a checking-in device should run.

Plain data in, plain data out: the control plane builds ``ReleasePolicy`` values from
its rows and asks ``desired_release`` for each device, and tests and benchmarks call
the same function without a database.

Overlapping releases are settled by one documented rule: the most specific target
wins (explicit device list, then static groups, then label/attribute filters, then
the whole fleet), then the higher priority, then the newer release.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from deploy.errors import PolicyError


class Specificity(IntEnum):
    FLEET = 0
    FILTER = 1
    GROUP = 2
    DEVICE_LIST = 3


@dataclass(frozen=True)
class DeviceFacts:
    device_id: str
    organisation_id: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    group_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Target:
    device_ids: frozenset[str] = frozenset()
    group_ids: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)
    percentage: float = 100.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.percentage <= 100.0:
            raise PolicyError(f"percentage must be between 0 and 100, got {self.percentage}")

    @property
    def specificity(self) -> Specificity:
        if self.device_ids:
            return Specificity.DEVICE_LIST
        if self.group_ids:
            return Specificity.GROUP
        if self.labels:
            return Specificity.FILTER
        return Specificity.FLEET


@dataclass(frozen=True)
class ReleasePolicy:
    release_id: str
    organisation_id: str
    version_id: str
    package_digest: str
    salt: str
    target: Target = Target()
    priority: int = 0
    created_at: float = 0.0


def bucket(salt: str, device_id: str) -> float:
    """A device's stable place in [0, 100) for a release: the same salt and id give the same place.

    A device is in a release at percentage p when its bucket is below p, so raising
    p only ever adds devices.
    """
    digest = hashlib.sha256(f"{salt}:{device_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100.0


def matches(target: Target, device: DeviceFacts) -> bool:
    """Whether the device is in the target's population (before the percentage is applied)."""
    if target.device_ids and device.device_id not in target.device_ids:
        return False
    if target.group_ids and not (target.group_ids & device.group_ids):
        return False
    return all(device.labels.get(k, device.attributes.get(k)) == v for k, v in target.labels.items())


def includes(policy: ReleasePolicy, device: DeviceFacts) -> bool:
    return (
        policy.organisation_id == device.organisation_id
        and matches(policy.target, device)
        and bucket(policy.salt, device.device_id) < policy.target.percentage
    )


def desired_release(device: DeviceFacts, releases: Iterable[ReleasePolicy]) -> ReleasePolicy | None:
    """The active release this device should follow, or None to keep what it runs."""
    candidates = [r for r in releases if includes(r, device)]
    if not candidates:
        return None
    return max(candidates, key=lambda r: (r.target.specificity, r.priority, r.created_at, r.release_id))
