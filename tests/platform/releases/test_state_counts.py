"""The stored reports per release and state (releases.selectors.release_state_counts: rows kept
by PostgreSQL triggers) equal counting the reports, after every kind of write."""

from __future__ import annotations

import importlib
import random

import pytest
from django.db import connection
from django.db.models import Count
from fleet.models import Device
from releases.models import DeviceReleaseStatus, Release
from releases.selectors import release_state_counts
from releases.services import release_create

STATES = ("downloading", "installed", "running", "refused", "failed")


def _counted(release_ids: list) -> dict[str, dict[str, int]]:
    """The trusted figure: every stored report counted."""
    counts: dict[str, dict[str, int]] = {str(r): {} for r in release_ids}
    rows = DeviceReleaseStatus.objects.filter(release_id__in=release_ids).values_list("release_id", "state")
    for release_id, state, n in rows.annotate(n=Count("id")).order_by():
        counts[str(release_id)][state] = n
    return counts


def _releases(org, version, devices: list[Device]) -> list[Release]:
    ids = [str(d.pk) for d in devices]
    return [
        release_create(organisation=org, version=version, name=f"r{i}", target={"device_ids": ids})
        for i in range(2)
    ]


def _step(rng: random.Random, releases: list[Release], devices: list[Device]) -> None:
    release = rng.choice(releases)
    rows = list(DeviceReleaseStatus.objects.filter(release=release).order_by("pk"))
    action = rng.choice(["report", "report", "again", "bulk", "delete"])
    if action == "report" or not rows:
        device = rng.choice(devices)
        DeviceReleaseStatus.objects.update_or_create(
            release=release, device=device, defaults={"state": rng.choice(STATES)}
        )
    elif action == "again":  # a report in the same state: the count must not move
        row = rng.choice(rows)
        row.message = "again"
        row.save()
    elif action == "bulk":
        chosen = [r.pk for r in rng.sample(rows, k=max(1, len(rows) // 2))]
        DeviceReleaseStatus.objects.filter(pk__in=chosen).update(state=rng.choice(STATES))
    else:
        rng.choice(rows).delete()


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(3))
def test_counts_equal_counting_the_reports_after_every_write(org, ready_version, seed):
    rng = random.Random(seed)
    devices = [Device.objects.create(organisation=org, name=f"d{i}") for i in range(10)]
    releases = _releases(org, ready_version, devices)
    ids = [r.pk for r in releases]
    for _ in range(40):
        _step(rng, releases, devices)
        assert release_state_counts(release_ids=ids) == _counted(ids)
    assert sum(len(states) for states in _counted(ids).values()) >= 3  # the walk spread the states
    releases[0].delete()  # its reports go with it
    assert release_state_counts(release_ids=ids) == _counted(ids)


@pytest.mark.django_db
def test_the_migration_counts_the_reports_already_there(org, ready_version):
    if connection.vendor != "postgresql":
        pytest.skip("the counts are kept by PostgreSQL triggers; other databases count the reports")
    migration = importlib.import_module("releases.migrations.0007_release_state_count")
    devices = [Device.objects.create(organisation=org, name=f"d{i}") for i in range(12)]
    releases = _releases(org, ready_version, devices)
    for i, device in enumerate(devices):
        DeviceReleaseStatus.objects.create(release=releases[i % 2], device=device, state=STATES[i % 5])
    ids = [r.pk for r in releases]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM releases_releasestatecount")  # as before the migration
        cursor.execute(migration.BACKFILL)
    assert release_state_counts(release_ids=ids) == _counted(ids)
    assert all(len(states) >= 2 for states in _counted(ids).values())
