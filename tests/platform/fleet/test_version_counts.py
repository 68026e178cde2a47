"""The fleet's live devices per running version (fleet.selectors.fleet_version_counts: rows kept
by PostgreSQL triggers) equal counting the devices, after every kind of write a fleet sees."""

from __future__ import annotations

import importlib
import random

import pytest
from accounts.services import organisation_ensure
from django.db import connection
from django.db.models import Count
from django.utils import timezone
from fleet.models import Device
from fleet.selectors import fleet_version_counts
from fleet.services import device_record_check_in, device_revoke
from registry.models import Artifact, Model, ModelVersion


def _counted(organisation_id) -> dict:
    """The trusted figure: every live device of the organisation counted."""
    rows = (
        Device.objects.filter(organisation_id=organisation_id, revoked_at__isnull=True)
        .values_list("running_version_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


def _versions(org, count: int) -> list[ModelVersion]:
    model = Model.objects.create(organisation=org, name="counted")
    versions = []
    for i in range(count):
        source = Artifact.objects.create(
            organisation=org, kind="onnx", file=f"c/{i}", sha256=f"{i:064d}", size=1
        )
        versions.append(
            ModelVersion.objects.create(model=model, label=f"v{i}", status="ready", source=source)
        )
    return versions


def _live(org) -> list[Device]:
    return list(Device.objects.filter(organisation=org).order_by("name"))


def _step(rng: random.Random, orgs: list, versions: list[ModelVersion]) -> None:
    """One write of the kinds that move a device between counts (or look as if they might)."""
    org = rng.choice(orgs)
    devices = _live(org)
    action = rng.choice(["enrol", "check_in", "revoke", "unrevoke", "bulk", "delete", "move", "save", "drop"])
    if action == "enrol" or not devices:
        running = rng.choice([None, *versions]) if org is orgs[0] else None
        revoked = timezone.now() if rng.random() < 0.2 else None
        Device.objects.create(
            organisation=org, name=f"d{rng.random()}", running_version=running, revoked_at=revoked
        )
    elif action == "check_in":  # a check-in reporting another version, or none, or the same
        device = rng.choice(devices)
        reported = rng.choice(["", *[str(v.pk) for v in versions]])
        device_record_check_in(device=device, attributes={"hw": "pi"}, running_version_id=reported)
    elif action == "revoke":
        device_revoke(device=rng.choice(devices))
    elif action == "unrevoke":
        Device.objects.filter(pk=rng.choice(devices).pk).update(revoked_at=None)
    elif action == "bulk":  # one statement moving many devices at once, in both directions
        chosen = [d.pk for d in rng.sample(devices, k=max(1, len(devices) // 2))]
        Device.objects.filter(pk__in=chosen).update(running_version=rng.choice([None, *versions]))
    elif action == "delete":
        rng.choice(devices).delete()
    elif action == "move":  # a full save that changes the organisation
        device = rng.choice(devices)
        device.organisation = orgs[1] if org is orgs[0] else orgs[0]
        device.save()
    elif action == "save":  # a full save that changes nothing the counts read
        device = rng.choice(devices)
        device.labels = {"ring": "canary"}
        device.save()
    elif action == "drop" and len(versions) > 1:  # a version deleted under its devices: SET_NULL
        versions.pop(rng.randrange(len(versions))).delete()


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(4))
def test_counts_equal_counting_the_devices_after_every_write(org, seed):
    rng = random.Random(seed)
    orgs = [org, organisation_ensure(name="Globex")]
    versions = _versions(org, 3)
    counted_versions = set()
    for _ in range(60):
        _step(rng, orgs, versions)
        for organisation in orgs:
            counts = fleet_version_counts(organisation_id=organisation.pk)
            assert counts == _counted(organisation.pk)
            counted_versions.update(counts)
    assert len(counted_versions) >= 2  # the walk did spread devices over versions (and none)


@pytest.mark.django_db
def test_a_fleet_that_left_counts_nothing(org):
    (version,) = _versions(org, 1)
    for i in range(3):
        Device.objects.create(organisation=org, name=f"d{i}", running_version=version)
    assert fleet_version_counts(organisation_id=org.pk) == {version.pk: 3}
    Device.objects.filter(organisation=org).update(revoked_at=timezone.now())
    assert fleet_version_counts(organisation_id=org.pk) == {}
    Device.objects.filter(organisation=org).delete()
    assert fleet_version_counts(organisation_id=org.pk) == {}


@pytest.mark.django_db
def test_the_migration_counts_the_devices_already_there(org):
    if connection.vendor != "postgresql":
        pytest.skip("the counts are kept by PostgreSQL triggers; other databases count the devices")
    migration = importlib.import_module("fleet.migrations.0007_device_version_count")
    versions = _versions(org, 2)
    for i in range(40):
        revoked = timezone.now() if i % 7 == 0 else None
        Device.objects.create(
            organisation=org, name=f"d{i}", running_version=[None, *versions][i % 3], revoked_at=revoked
        )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM fleet_deviceversioncount")  # as before the migration
        cursor.execute(migration.BACKFILL)
    assert fleet_version_counts(organisation_id=org.pk) == _counted(org.pk)
    assert len(_counted(org.pk)) == 3
