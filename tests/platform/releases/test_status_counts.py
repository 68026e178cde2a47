"""A release's by_state (releases.status_counts) equals counting its per-device rows one by one
(releases.selectors.release_device_statuses), while the fleet changes under a kept split."""

from __future__ import annotations

import random

import pytest
from django.core.cache import cache
from django.utils import timezone
from fleet.models import Device
from releases.models import DeviceReleaseStatus
from releases.selectors import release_device_statuses, release_selection
from releases.services import release_create, release_gate_evaluate, release_transition
from releases.status_counts import (
    REPORTED_ONLY_STATES,
    release_device_statuses_in,
    release_device_summary,
)

STATES = ("downloading", "installed", "running", "refused", "failed")


def _by_rows(release) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in release_device_statuses(release=release):
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


def _summary(release) -> dict[str, int]:
    release.refresh_from_db()
    return release_device_summary(release=release)


def _fleet(org, rng: random.Random, count: int, version) -> None:
    for i in range(count):
        hw = rng.choice(["pi", "pi", "x86"])
        running = version if rng.random() < 0.2 else None
        Device.objects.create(
            organisation=org, name=f"d{i:03d}", attributes={"hw": hw}, running_version=running
        )


def _step(rng: random.Random, org, release, version) -> None:
    """One thing that happens to a fleet under a release: a first report from a selected device
    that was pending, a later report (both seen at once), or an install without a report (an
    older agent), an enrolment or a revocation (seen when the kept split expires)."""
    action = rng.choice(["first_report", "report", "install", "enrol", "revoke"])
    if action in ("install", "enrol", "revoke"):
        cache.delete(f"releases:unreported:{release.pk}")  # UNREPORTED_SECONDS passed
    reported = set(DeviceReleaseStatus.objects.filter(release=release).values_list("device_id", flat=True))
    live = Device.objects.filter(organisation=org, revoked_at__isnull=True)
    if action == "first_report":
        selected = release_selection(release).selected
        pending = [
            d for d in live.exclude(pk__in=reported).exclude(running_version=version) if str(d.pk) in selected
        ]
        if pending:
            device = rng.choice(pending)
            DeviceReleaseStatus.objects.create(release=release, device=device, state=rng.choice(STATES))
    elif action == "report" and reported:
        row = rng.choice(list(DeviceReleaseStatus.objects.filter(release=release).order_by("pk")))
        row.state = rng.choice(STATES)
        row.save()
    elif action == "install":
        candidates = list(live.exclude(running_version=version).order_by("name"))
        if candidates:
            device = rng.choice(candidates)
            Device.objects.filter(pk=device.pk).update(running_version=version)
    elif action == "enrol":
        Device.objects.create(organisation=org, name=f"new-{rng.random()}", attributes={"hw": "pi"})
    elif action == "revoke":
        candidates = list(live.order_by("name"))
        if candidates:
            Device.objects.filter(pk=rng.choice(candidates).pk).update(revoked_at=timezone.now())


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(4))
def test_by_state_equals_counting_the_rows_while_the_fleet_changes(org, ready_version, seed):
    rng = random.Random(seed)
    _fleet(org, rng, rng.randint(12, 30), ready_version)
    release = release_create(
        organisation=org,
        version=ready_version,
        name="r",
        target={"filter": "hw == pi"},
        phases=[{"percentage": rng.choice([30, 60, 100])}],
        start=True,
    )
    assert _summary(release) == _by_rows(release)
    for _ in range(12):
        _step(rng, org, release, ready_version)
        release.refresh_from_db()
        assert _summary(release) == _by_rows(release)


@pytest.mark.django_db
def test_devices_entering_or_leaving_the_target_are_seen_when_the_kept_split_expires(org, ready_version):
    _fleet(org, random.Random(7), 10, None)
    device = Device.objects.filter(attributes__hw="pi").first()
    release = release_create(
        organisation=org, version=ready_version, name="r", target={"filter": "hw == pi"}, start=True
    )
    before = _summary(release)
    Device.objects.filter(pk=device.pk).update(attributes={"hw": "x86"})
    Device.objects.create(organisation=org, name="late", attributes={"hw": "pi"})
    assert _summary(release) == before  # kept: neither the attributes nor an enrolment move it
    assert release_device_summary(release=release, keep=False) == _by_rows(release)
    cache.delete(f"releases:unreported:{release.pk}")  # what UNREPORTED_SECONDS does
    assert _summary(release) == _by_rows(release) == {"pending": before["pending"]}  # one out, one in


@pytest.mark.django_db
def test_releases_that_select_nobody_count_their_reports_only(org, ready_version):
    _fleet(org, random.Random(3), 6, None)
    release = release_create(
        organisation=org, version=ready_version, name="r", target={"filter": "hw == pi"}, start=True
    )
    DeviceReleaseStatus.objects.create(release=release, device=Device.objects.first(), state="refused")
    release_transition(release_id=release.pk, action="abort")
    assert _summary(release) == _by_rows(release) == {"refused": 1}


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(3))
def test_a_reported_only_state_pages_the_same_rows_in_the_same_order(org, ready_version, seed):
    rng = random.Random(seed)
    names = ["Zeta", "alpha", "Ärger", "b_1", "b-1", "B1", "zz", "a"]
    for i in range(16):
        name = rng.choice(names)  # repeated names: the id breaks the tie
        Device.objects.create(organisation=org, name=name, attributes={"hw": "pi", "i": str(i)})
    release = release_create(
        organisation=org, version=ready_version, name="r", target={"filter": "hw == pi"}, start=True
    )
    for device in Device.objects.all():
        state = rng.choice([*REPORTED_ONLY_STATES, "running"])
        DeviceReleaseStatus.objects.create(
            release=release, device=device, state=state, reason_code=rng.choice(["", "x"]), message="m"
        )
    for state in sorted(REPORTED_ONLY_STATES):
        expected = release_device_statuses(release=release, state=state)
        assert list(release_device_statuses_in(release=release, state=state)) == expected, state
    with pytest.raises(ValueError):
        release_device_statuses_in(release=release, state="pending")


@pytest.mark.django_db
def test_the_gate_keeps_the_split_so_the_detail_only_reads_it(org, ready_version, django_assert_num_queries):
    _fleet(org, random.Random(5), 20, ready_version)
    release = release_create(
        organisation=org,
        version=ready_version,
        name="r",
        target={"filter": "hw == pi"},
        phases=[{"percentage": 60, "min_soak_seconds": 3600}],
        start=True,
    )
    Device.objects.create(organisation=org, name="late", attributes={"hw": "pi"})  # seen by the gate
    cache.delete(f"releases:unreported:{release.pk}")
    assert release_gate_evaluate(release_id=release.pk)["step"] == "wait"
    release.refresh_from_db()
    with django_assert_num_queries(1):  # the stored reports by state: no selection computed
        summary = release_device_summary(release=release)
    assert summary == _by_rows(release)
    assert sum(summary.values()) == len(release_selection(release).selected) > 0
