"""Which version a checking-in device should run, and why.

Plain data in, plain data out: the control plane builds ``ReleasePolicy`` values from
its rows and ``DeviceFacts`` from a device, and asks ``decide`` (or a prepared
``PolicySet``); tests and benchmarks call the same code without a database.

The order of precedence, documented in the README:

1. a version pinned on the device, then one pinned on one of its groups, wins outright;
2. otherwise, among the releases that cover the device, the most specific target wins
   (explicit device list, then groups, then filter/labels, then the whole fleet), then
   the higher priority, then the newer release (then the release id, so ties are stable);
3. an aborted or rolled-back release that wins sends the device back to the version it
   ran before it first received the release (``rollback=True``).

A release covers a device when the device is in its organisation, matches every part of
its target (device list, groups, filter and labels combine with AND) and its stable
bucket is in the current phase. A paused release stops spreading but does not go back: it
keeps the devices of the phases reached so far that it already reached (they run its version,
or ran it since the release started: a device pinned away and unpinned returns to it), and
gives nothing to the devices it has not reached yet. An aborted or rolled-back one covers the
devices it reached that still run its version.

Small fleets: which devices a phase selects. Every device has a stable bucket in [0, 100)
per release, ``bucket(salt, device id)``. A phase at p % selects the k = ⌈p·N/100⌉ devices
with the lowest buckets among the N devices that match the target (at least one when
N ≥ 1), so a 1 % canary of a 3-device fleet is exactly one device, where "bucket < 1" would
most likely select none. Counting N needs the whole population, which a check-in must not
read, so the work is split:

- the control plane computes the phase's *threshold* (``selection_threshold``: the k-th
  smallest bucket of the matching devices) when the phase starts or advances, when a
  paused release resumes and on every gate evaluation (which also sees devices that
  enrolled or changed since), and stores it on the release;
- the per-check-in check (``Target.in_phase``, compiled in ``_compile_covers``) compares the
  device's bucket with that stored number: one hash and one comparison, as before.

Buckets never change, so for the same population a higher percentage has a higher (or the
same) threshold: raising p only adds devices. When the population changes the threshold
follows it, except that it never drops below a device the release already reached (selected
before and running its version): that device keeps the version, so after the fleet grows a
phase may hold those few devices more than ⌈p·N⌉. A release without a computed threshold
(never started, or no matching device yet) falls back to "bucket < p", and a 100 % phase
takes every matching device, including ones that enrol later.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from deploy.errors import PolicyError
from deploy.filters import Filter
from deploy.phases import ROLLING_BACK, Status
from deploy.windows import MaintenanceWindow


class Specificity(IntEnum):
    FLEET = 0
    FILTER = 1
    GROUP = 2
    DEVICE_LIST = 3


@dataclass(frozen=True)
class VersionRef:
    version_id: str
    package_digest: str


@dataclass(frozen=True)
class DeviceFacts:
    device_id: str
    organisation_id: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    group_ids: frozenset[str] = frozenset()  # static groups the device is a member of
    running_version_id: str = ""
    pin: VersionRef | None = None  # the device's own pin, else its group's (resolved by the caller)
    window: MaintenanceWindow | None = None  # its group's maintenance window, if any
    # release id -> the version the device ran before that release first reached it
    previous_versions: Mapping[str, VersionRef | None] = field(default_factory=dict)
    # ids of paused releases whose version the device has run since the release started
    reached_by: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Target:
    device_ids: frozenset[str] = frozenset()
    group_ids: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)
    percentage: float = 100.0
    filter: Filter | None = None
    # dynamic groups among group_ids: id -> saved filter, so devices that appear later join
    group_filters: Mapping[str, Filter] = field(default_factory=dict)
    # the phase's highest selected bucket, computed by the control plane from the matching
    # population (selection_threshold); None: not computed yet, "bucket < percentage" decides
    threshold: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.percentage <= 100.0:
            raise PolicyError(f"percentage must be between 0 and 100, got {self.percentage}")
        stray = set(self.group_filters) - set(self.group_ids)
        if stray:
            raise PolicyError(f"group filters given for groups not in the target: {sorted(stray)}")

    def in_phase(self, device_bucket: float) -> bool:
        """Whether a matching device with this bucket is in the current phase."""
        if self.percentage >= 100:
            return True
        if self.threshold is None:
            return device_bucket < self.percentage
        return device_bucket <= self.threshold

    @property
    def specificity(self) -> Specificity:
        if self.device_ids:
            return Specificity.DEVICE_LIST
        if self.group_ids:
            return Specificity.GROUP
        if self.labels or self.filter is not None:
            return Specificity.FILTER
        return Specificity.FLEET


@dataclass(frozen=True)
class ReleasePolicy:
    release_id: str
    organisation_id: str
    version_id: str
    package_digest: str
    salt: str
    target: Target = Target()  # its percentage is the current phase's
    priority: int = 0
    created_at: float = 0.0
    status: str = Status.ACTIVE
    download_only: bool = False
    window: MaintenanceWindow | None = None

    @property
    def rank(self) -> tuple:
        return (self.target.specificity, self.priority, self.created_at, self.release_id)


@dataclass(frozen=True)
class Decision:
    """What a device should run. release_id is empty for a pin."""

    version_id: str
    package_digest: str
    release_id: str = ""
    download_only: bool = False
    rollback: bool = False
    window: MaintenanceWindow | None = None
    reason: str = "release"  # "release", "pin" or "rollback"


def bucket(salt: str, device_id: str) -> float:
    """A device's stable place in [0, 100) for a release: the same salt and id give the same place.

    A device is in a release at percentage p when its bucket is below p, so raising
    p only ever adds devices.
    """
    digest = hashlib.sha256(f"{salt}:{device_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100.0


def selected_count(percentage: float, matching: int) -> int:
    """How many of `matching` devices a phase at `percentage` selects: ⌈p·N/100⌉, at least one
    when any device matches (and none at 0 %)."""
    if matching <= 0 or percentage <= 0:
        return 0
    # rounded first so float noise (e.g. 3.0000000000000004) does not add a device
    return min(matching, max(1, math.ceil(round(percentage * matching / 100.0, 9))))


def selection_threshold(
    percentage: float, buckets: Iterable[float], keep: Iterable[float] = ()
) -> float | None:
    """The phase's threshold over the matching devices' buckets: the k-th smallest bucket, k =
    selected_count; None when nothing matches (the check then falls back to bucket < p).

    ``keep``: buckets of devices the release already reached (selected before and running its
    version); the threshold never drops below them, so a growing fleet does not take the
    version back from a device that has it.
    """
    ordered = sorted(buckets)
    count = selected_count(percentage, len(ordered))
    if percentage >= 100:
        return 100.0
    if count == 0:
        return None if not ordered else -1.0  # 0 %: nobody, whatever enrols
    return max(ordered[count - 1], max(keep, default=-1.0))


def _in_groups(target: Target, device: DeviceFacts) -> bool:
    if target.group_ids & device.group_ids:
        return True
    return any(f.predicate(device.attributes, device.labels) for f in target.group_filters.values())


def matches(target: Target, device: DeviceFacts) -> bool:
    """Whether the device is in the target's population (before the percentage is applied)."""
    if target.device_ids and device.device_id not in target.device_ids:
        return False
    if target.group_ids and not _in_groups(target, device):
        return False
    for key, value in target.labels.items():
        if device.labels.get(key, device.attributes.get(key)) != value:
            return False
    return target.filter is None or target.filter.predicate(device.attributes, device.labels)


def includes(policy: ReleasePolicy, device: DeviceFacts) -> bool:
    """Whether the device is in the release's current phase (its state aside)."""
    return (
        policy.organisation_id == device.organisation_id
        and policy.target.percentage > 0
        and matches(policy.target, device)
        and policy.target.in_phase(bucket(policy.salt, device.device_id))
    )


def covers(policy: ReleasePolicy, device: DeviceFacts) -> bool:
    """Whether the release has a say over this device in its current state."""
    if policy.status in ROLLING_BACK:
        # only while the device still runs the withdrawn version: once it is back, the other
        # releases decide again (an old abort must not hold devices forever)
        return (
            policy.organisation_id == device.organisation_id
            and device.running_version_id == policy.version_id
            and policy.release_id in device.previous_versions
        )
    if policy.status == Status.PAUSED:
        return _reached(policy.release_id, policy.version_id, device) and includes(policy, device)
    if policy.status in (Status.ACTIVE, Status.COMPLETED):
        return includes(policy, device)
    return False


def _reached(release_id: str, version_id: str, device: DeviceFacts) -> bool:
    """Whether a release already reached the device: it runs the version, or ran it since."""
    return device.running_version_id == version_id or release_id in device.reached_by


def _decision(policy: ReleasePolicy, device: DeviceFacts) -> Decision | None:
    window = policy.window or device.window
    if policy.status in ROLLING_BACK:
        previous = device.previous_versions.get(policy.release_id)
        if previous is None or previous.version_id == policy.version_id:
            return None  # nothing to go back to: keep what it runs
        return Decision(
            previous.version_id, previous.package_digest, policy.release_id, False, True, window, "rollback"
        )
    return Decision(
        policy.version_id, policy.package_digest, policy.release_id, policy.download_only, False, window
    )


Check = Callable[[DeviceFacts], bool]


def _compile_covers(policy: ReleasePolicy) -> Check:
    """covers() for one release as a closure over its fields, cheapest test first.

    The same rules as covers(), which stays the reference (a property test holds the two
    equal); this form only saves attribute look-ups on the check-in path.
    """
    if policy.status not in ROLLING_BACK and policy.status not in (
        Status.PAUSED,
        Status.ACTIVE,
        Status.COMPLETED,
    ):
        return lambda device: False
    organisation, version, release_id = policy.organisation_id, policy.version_id, policy.release_id
    if policy.status in ROLLING_BACK:
        return lambda device: (
            device.organisation_id == organisation
            and device.running_version_id == version
            and release_id in device.previous_versions
        )
    target, salt = policy.target, policy.salt
    percentage = target.percentage
    if percentage <= 0:
        return lambda device: False
    tests: list[Check] = []
    if policy.status == Status.PAUSED:
        tests.append(lambda device: _reached(release_id, version, device))
    if target.device_ids:
        ids = target.device_ids
        tests.append(lambda device: device.device_id in ids)
    if target.group_ids:
        tests.append(lambda device: _in_groups(target, device))
    if target.labels:
        labels = tuple(target.labels.items())
        tests.append(
            lambda device: all(device.labels.get(k, device.attributes.get(k)) == v for k, v in labels)
        )
    if target.filter is not None:
        predicate = target.filter.predicate
        tests.append(lambda device: predicate(device.attributes, device.labels))
    if percentage < 100:  # Target.in_phase, unrolled: one hash and one comparison per check-in
        threshold = target.threshold
        if threshold is None:
            tests.append(lambda device: bucket(salt, device.device_id) < percentage)
        else:
            tests.append(lambda device: bucket(salt, device.device_id) <= threshold)

    def check(device: DeviceFacts) -> bool:
        if device.organisation_id != organisation:
            return False
        for test in tests:  # noqa: SIM110 - a plain loop: all() over a generator costs a frame per call
            if not test(device):
                return False
        return True

    return check


class PolicySet:
    """An organisation's releases, ranked once, so each check-in stops at the first that covers it."""

    def __init__(self, policies: Iterable[ReleasePolicy]) -> None:
        self.policies = sorted(policies, key=lambda p: p.rank, reverse=True)
        self._checks = [(_compile_covers(p), p) for p in self.policies]

    def winner(self, device: DeviceFacts) -> ReleasePolicy | None:
        for check, policy in self._checks:
            if check(device):
                return policy
        return None

    def decide(self, device: DeviceFacts) -> Decision | None:
        if device.pin is not None:
            return Decision(
                device.pin.version_id, device.pin.package_digest, window=device.window, reason="pin"
            )
        policy = self.winner(device)
        return None if policy is None else _decision(policy, device)


def decide(device: DeviceFacts, releases: Iterable[ReleasePolicy]) -> Decision | None:
    """What the device should run, or None to keep what it runs."""
    return PolicySet(releases).decide(device)


def desired_release(device: DeviceFacts, releases: Iterable[ReleasePolicy]) -> ReleasePolicy | None:
    """The release that has the say over this device (pins aside), or None."""
    return PolicySet(releases).winner(device)
