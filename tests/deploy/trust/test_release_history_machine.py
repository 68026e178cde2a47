"""A property test of the trust model over deploy/'s pure logic: releases, rollbacks, pins,
unpins, agent restarts, devices going offline for long, time passing, the control plane's
database restored from a backup and a gateway replaying old assignments, in any order.  After
quiescence every device runs exactly what the control plane decides for it, and every refusal
is a replay the test injected.

The director here is a small pure model of releases.assignments (one signed assignment per
device, reissued when the decision changes or half its lifetime passed, counter max(last + 1,
now in ms)); the devices verify with deploy.trust.assignment as the agent does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from deploy.package import generate_keypair
from deploy.phases import Status
from deploy.rollout import DeviceFacts, PolicySet, ReleasePolicy, VersionRef
from deploy.trust.assignment import Assignment, AssignmentRefused, sign_assignment, verify_assignment

KEYS = generate_keypair()
ORG = "org-1"
TTL = 100  # seconds of the model's clock
DEVICES = ("d0", "d1", "d2")
VERSIONS = {f"v{i}": VersionRef(f"v{i}", hashlib.sha256(f"v{i}".encode()).hexdigest()) for i in range(4)}


@dataclass
class Held:
    wanted: tuple
    blob: bytes
    signature: bytes
    counter: int
    expires_at: int


@dataclass
class Director:
    """The control plane: policies, pins, the devices' reported history, one assignment each."""

    releases: list[ReleasePolicy] = field(default_factory=list)
    pins: dict[str, VersionRef | None] = field(default_factory=dict)
    running: dict[str, str] = field(default_factory=dict)
    changes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (from, to), in order
    held: dict[str, Held] = field(default_factory=dict)
    issued: dict[str, list[tuple[bytes, bytes]]] = field(default_factory=dict)

    def report(self, device: str, version_id: str) -> None:
        before = self.running.get(device, "")
        if version_id and version_id != before:
            self.changes.setdefault(device, []).append((before, version_id))
        self.running[device] = version_id

    def facts(self, device: str) -> DeviceFacts:
        first: dict[str, str] = {}
        for before, after in self.changes.get(device, []):
            first.setdefault(after, before)
        previous = {
            p.release_id: VERSIONS.get(first[p.version_id])
            for p in self.releases
            if p.status == Status.ROLLED_BACK and p.version_id in first
        }
        return DeviceFacts(
            device_id=device,
            organisation_id=ORG,
            running_version_id=self.running.get(device, ""),
            pin=self.pins.get(device),
            previous_versions=previous,
        )

    def decide(self, device: str):
        return PolicySet(self.releases).decide(self.facts(device))

    def assignment(self, device: str, now: int) -> tuple[bytes, bytes] | None:
        decision = self.decide(device)
        if decision is None:
            return None
        wanted = (decision.version_id, decision.release_id, decision.rollback)
        held = self.held.get(device)
        if held is not None and held.wanted == wanted and held.expires_at - now > TTL / 2:
            return held.blob, held.signature
        # wall-clock milliseconds: a restored director never reuses a counter (see assignments.py)
        counter = max((held.counter if held else 0) + 1, now * 1000)
        assignment = Assignment(
            device_id=device,
            organisation_id=ORG,
            counter=counter,
            issued_at=now,
            expires_at=now + TTL,
            version_id=decision.version_id,
            release_id=decision.release_id,
            package_digest=decision.package_digest,
            package_size=1000,
            manifest_sha256="0" * 64,
            rollback=decision.rollback,
        )
        blob, signature = sign_assignment(assignment, KEYS.private_key)
        self.held[device] = Held(wanted, blob, signature, counter, now + TTL)
        self.issued.setdefault(device, []).append((blob, signature))
        return blob, signature


@dataclass
class Device:
    """An agent: what it runs and, durably, the last assignment it accepted."""

    name: str
    running: str = ""
    last_counter: int = 0
    last_sha256: str = ""
    refusals: list[str] = field(default_factory=list)

    def offered(self, blob: bytes, signature: bytes, now: int) -> None:
        try:
            assignment = verify_assignment(
                blob,
                signature,
                [KEYS.public_key],
                device_id=self.name,
                organisation_id=ORG,
                last_counter=self.last_counter,
                last_sha256=self.last_sha256,
                now=now,
            )
        except AssignmentRefused as refused:
            self.refusals.append(refused.code)
            return
        self.last_counter, self.last_sha256 = assignment.counter, hashlib.sha256(blob).hexdigest()
        self.running = assignment.version_id  # download, verify and activate, all fine here


class ReleaseHistory(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.now = 1_000_000
        self.director = Director()
        self.devices = {name: Device(name) for name in DEVICES}
        self.offline: set[str] = set()
        self.replays = 0
        self.serial = 0

    def check_in(self, name: str) -> None:
        device = self.devices[name]
        self.director.report(name, device.running)
        offer = self.director.assignment(name, self.now)
        if offer is not None:
            device.offered(*offer, self.now)
            self.director.report(name, device.running)

    @rule(version=st.sampled_from(sorted(VERSIONS)))
    def release(self, version: str) -> None:
        self.serial += 1
        ref = VERSIONS[version]
        self.director.releases.append(
            ReleasePolicy(
                f"r{self.serial}", ORG, ref.version_id, ref.package_digest, "salt", created_at=self.serial
            )
        )

    @rule(data=st.data())
    def roll_back(self, data) -> None:
        live = [i for i, p in enumerate(self.director.releases) if p.status == Status.ACTIVE]
        if live:
            i = data.draw(st.sampled_from(live))
            policy = self.director.releases[i]
            self.director.releases[i] = ReleasePolicy(**{**policy.__dict__, "status": Status.ROLLED_BACK})

    @rule(name=st.sampled_from(DEVICES), version=st.sampled_from(sorted(VERSIONS)))
    def pin(self, name: str, version: str) -> None:
        self.director.pins[name] = VERSIONS[version]

    @rule(name=st.sampled_from(DEVICES))
    def unpin(self, name: str) -> None:
        self.director.pins[name] = None

    @rule(name=st.sampled_from(DEVICES))
    def restart(self, name: str) -> None:
        old = self.devices[name]  # only the state directory survives: running + the counter file
        self.devices[name] = Device(name, old.running, old.last_counter, old.last_sha256, old.refusals)

    @rule(name=st.sampled_from(DEVICES))
    def go_offline(self, name: str) -> None:
        self.offline.add(name)

    @rule(name=st.sampled_from(DEVICES))
    def come_online(self, name: str) -> None:
        self.offline.discard(name)

    @rule(seconds=st.integers(min_value=0, max_value=TTL))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds

    @rule()
    def director_restored_from_a_backup(self) -> None:
        """The control plane's database goes back in time: its assignments are forgotten (a
        restore takes more than a second, and its counters are milliseconds of the clock)."""
        self.director.held.clear()
        self.now += 1

    @rule(name=st.sampled_from(DEVICES))
    def checks_in(self, name: str) -> None:
        if name not in self.offline:
            self.check_in(name)

    @rule(name=st.sampled_from(DEVICES), data=st.data())
    def gateway_replays_an_old_assignment(self, name: str, data) -> None:
        issued = self.director.issued.get(name, [])
        device = self.devices[name]
        older = [(b, s) for b, s in issued if hashlib.sha256(b).hexdigest() != device.last_sha256]
        if older:
            before = (device.running, device.last_counter)
            device.offered(*data.draw(st.sampled_from(older)), self.now)
            self.replays += 1
            assert (device.running, device.last_counter) == before  # a replay never moves a device

    @invariant()
    def every_refusal_is_an_injected_replay(self) -> None:
        refused = [code for d in self.devices.values() for code in d.refusals]
        assert len(refused) <= self.replays
        assert set(refused) <= {"stale_counter", "expired"}

    def teardown(self) -> None:
        """Quiescence: everyone online, a few rounds of check-ins, then each device runs what the
        control plane decides (or, decided nothing, keeps what it ran)."""
        self.offline.clear()
        for _ in range(3):
            self.now += 1
            for name in DEVICES:
                self.check_in(name)
        for name, device in self.devices.items():
            decision = self.director.decide(name)
            if decision is not None:
                assert device.running == decision.version_id, (name, decision, device)
                assert device.last_counter == self.director.held[name].counter


ReleaseHistory.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
TestReleaseHistory = ReleaseHistory.TestCase
