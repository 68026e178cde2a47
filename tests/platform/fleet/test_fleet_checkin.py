"""Check-ins that change nothing must cost (almost) nothing on the control plane."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from fleet.models import Device, DeviceVersionChange
from fleet.services import device_enrol, device_record_check_in, enrolment_token_create

ATTRS = {"hardware": "pi4", "os": "linux"}


def _device(org) -> Device:
    token = enrolment_token_create(organisation=org).token
    return device_enrol(token=token, name="d", attributes=ATTRS, labels={}).device


def test_unchanged_check_in_makes_no_query(org, ready_version, django_assert_num_queries):
    device = _device(org)
    device_record_check_in(device=device, attributes=ATTRS, running_version_id=str(ready_version.pk))
    with django_assert_num_queries(0):
        device_record_check_in(device=device, attributes=ATTRS, running_version_id=str(ready_version.pk))
    assert Device.objects.get(pk=device.pk).running_version_id == ready_version.pk


def test_changes_and_stale_last_seen_are_written(org, ready_version):
    device = _device(org)
    device_record_check_in(device=device, attributes={**ATTRS, "ram_mb": "2048"}, running_version_id="")
    assert Device.objects.get(pk=device.pk).attributes["ram_mb"] == "2048"
    Device.objects.filter(pk=device.pk).update(last_seen_at=timezone.now() - timedelta(minutes=5))
    device.refresh_from_db()
    device_record_check_in(device=device, attributes={}, running_version_id=str(ready_version.pk))
    stored = Device.objects.get(pk=device.pk)
    assert timezone.now() - stored.last_seen_at < timedelta(seconds=30)
    assert stored.running_version_id == ready_version.pk
    assert DeviceVersionChange.objects.filter(device=device, to_version=ready_version).count() == 1


def test_malformed_version_id_is_treated_as_unknown(org):
    device = _device(org)
    device_record_check_in(device=device, attributes=ATTRS, running_version_id="not-a-uuid")
    assert Device.objects.get(pk=device.pk).running_version_id is None
