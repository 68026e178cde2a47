"""Pause holds, abort returns: a paused release keeps the devices it reached (even one a pin
took away and gave back) and spreads no further; the gate counts only telemetry on the
release's version from its selected devices; a gate abort rolls back every device the release
moved and says why on the release and in its audit log."""

# ruff: noqa: F811 - the tests take the imported second_version fixture as an argument
from __future__ import annotations

import time

from fleet.models import Device
from releases.models import Release, ReleaseEvent
from releases.selectors import desired_package_for, release_selection
from releases.services import release_gate_evaluate
from telemetry.services import IncomingRecord, telemetry_ingest

from tests.platform.releases.test_rollout_api import (  # noqa: F401 - second_version is a fixture
    _create,
    _devices,
    _install,
    _metrics,
    second_version,
)

HALF = [{"percentage": 50, "min_reporting_devices": 50}, {"percentage": 100}]


def _fresh(device: Device) -> Device:
    return Device.objects.get(pk=device.pk)


def _pin(api, device: Device, version) -> None:
    body = {"version": str(version.pk) if version is not None else None}
    response = api.post(f"/api/v1/devices/{device.pk}/pin/", body, format="json")
    assert response.status_code == 200, response.content


def _act(api, release: dict, action: str) -> None:
    response = api.post(f"/api/v1/releases/{release['id']}/{action}/", {"reason": "test"}, format="json")
    assert response.status_code == 200, response.content


def test_a_paused_release_holds_what_it_reached_and_spreads_no_further(
    api, org, ready_version, second_version
):
    devices = _devices(org, 4, ready_version)
    old = _create(api, ready_version, name="old", start=True).json()
    new = _create(api, second_version, name="new", phases=HALF, start=True).json()
    selected = [
        d for d in devices if str(d.pk) in release_selection(Release.objects.get(pk=new["id"])).selected
    ]
    others = [d for d in devices if d not in selected]
    assert len(selected) == 2
    reached, not_yet = selected
    assert _install([reached], second_version)  # the other selected device is offline for now

    _pin(api, reached, ready_version)  # pinned away from the release's version
    assert _install([reached], ready_version)
    _act(api, new, "pause")
    _pin(api, reached, None)

    desired = desired_package_for(_fresh(reached))
    assert desired.version == second_version and str(desired.release.pk) == new["id"]  # back, not older
    for device in (not_yet, *others):  # not reached: the paused release gives them nothing
        desired = desired_package_for(_fresh(device))
        assert desired.version == ready_version and str(desired.release.pk) == old["id"]

    _act(api, new, "resume")  # spreading again: the selected device that was offline joins
    assert desired_package_for(_fresh(not_yet)).version == second_version
    assert all(desired_package_for(_fresh(d)).version == ready_version for d in others)


def test_devices_pinned_to_another_version_do_not_count_in_the_gate(api, org, ready_version, second_version):
    """Pinned away (its own pin, or its group's), a device is not the release's: neither its
    restarts on the pinned version nor a late record from its time on the release's version
    count in any of the gate's figures."""
    fleet = _devices(org, 2, ready_version)
    pinned = _devices(org, 1, ready_version)[0]
    kiosk = _devices(org, 1, ready_version, role="kiosk")[0]
    release = _create(api, second_version, start=True).json()  # the default gate
    _install([*fleet, pinned, kiosk], second_version)
    _pin(api, pinned, ready_version)
    group = {
        "name": "kiosks",
        "kind": "dynamic",
        "filter": "role == kiosk",
        "pinned_version": str(ready_version.pk),
    }
    assert api.post("/api/v1/device-groups/", group, format="json").status_code == 201
    _install([pinned, kiosk], ready_version)
    for device in fleet:
        _metrics(device, second_version)
    for seq, device in enumerate((pinned, kiosk)):
        crashing = {"inferences": 10, "errors": 90, "restarts": 5, "latency_ms_p95": 500.0}
        records = [
            IncomingRecord(900 + seq, "metrics", time.time(), str(ready_version.pk), crashing),
            IncomingRecord(950 + seq, "metrics", time.time(), str(second_version.pk), crashing),
        ]
        telemetry_ingest(device=device, records=records)
    status = release_gate_evaluate(release_id=release["id"])
    figures = status["figures"]
    assert figures["devices_pinned_away"] == 2 and figures["devices_selected"] == 4, status
    assert figures["devices_reporting"] == 2 and figures["devices_pending"] == 0, status
    assert figures["restarts_per_device"] == 0.0 and figures["error_rate"] == 0.0, status
    assert figures["latency_ms_p95"] == 10.0 and status["failures"] == [], status
    assert Release.objects.get(pk=release["id"]).state == "completed"


def test_a_gate_abort_rolls_back_every_device_it_moved_and_says_why(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    gate = {"max_error_rate": 0.1, "on_failure": "abort"}
    release = _create(api, second_version, start=True, gate=gate).json()
    moved = _install(devices[:2], second_version)
    assert len(moved) == 2
    for device in moved:
        _metrics(device, second_version, errors=50)
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "abort" and "inference error rate" in status["reason"]

    row = Release.objects.get(pk=release["id"])
    assert row.state == "aborted" and "inference error rate" in row.gate_status["reason"]
    event = ReleaseEvent.objects.get(release=row, action="abort")
    assert event.actor is None and "inference error rate" in event.reason  # the gate did it
    detail = api.get(f"/api/v1/releases/{release['id']}/").json()
    assert "inference error rate" in detail["gate_status"]["reason"]
    for device in moved:
        desired = desired_package_for(_fresh(device))
        assert desired.rollback and desired.version == ready_version
    assert desired_package_for(_fresh(devices[2])) is None  # never moved: nothing to undo
    _install(moved, ready_version)
    assert all(desired_package_for(_fresh(d)) is None for d in moved)  # back, and it stays
