"""Truthful rollouts through the control plane: gates measure the release's own devices, a
small fleet gets ⌈p·N⌉ canaries, silence is pending, bad telemetry is skipped, one broken
release does not stop the others, and a target that matches nothing is refused or waits."""

# ruff: noqa: F811 - the tests take the imported second_version fixture as an argument
from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone
from fleet.models import Device
from releases.models import DeviceReleaseStatus, Release
from releases.selectors import desired_package_for
from releases.services import release_gate_evaluate, release_gates_evaluate_all
from telemetry.selectors import fleet_rates
from telemetry.services import IncomingRecord, telemetry_ingest

from deploy.rollout import bucket
from tests.platform.releases.test_rollout_api import (  # noqa: F401 - second_version is a fixture
    _create,
    _devices,
    _install,
    _metrics,
    second_version,
)


def _offered(devices: list[Device], version) -> list[Device]:
    return [d for d in devices if (w := desired_package_for(d)) is not None and w.version == version]


def test_a_one_percent_canary_of_three_devices_is_one_device(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    phases = [{"percentage": 1}, {"percentage": 100}]
    release = _create(api, second_version, phases=phases, start=True, allow_empty=False).json()
    assert release["devices"]["matching"] == 3
    assert len(_offered(devices, second_version)) == 1
    api.post(f"/api/v1/releases/{release['id']}/advance/", {"phase": 1}, format="json")
    assert len(_offered(devices, second_version)) == 3  # the canary stays, the others join


def test_the_gate_counts_only_devices_the_release_selected(api, org, ready_version, second_version):
    """A device on the same version that the release never targeted (pinned) cannot fail its gate."""
    canaries = _devices(org, 2, ready_version, tier="canary")
    outsider = _devices(org, 1, ready_version, tier="prod")[0]
    api.post(f"/api/v1/devices/{outsider.pk}/pin/", {"version": str(second_version.pk)}, format="json")
    _install([outsider], second_version)
    body = {"target": {"labels": {"tier": "canary"}}, "gate": {"max_error_rate": 0.05}, "start": True}
    release = _create(api, second_version, **body).json()
    _install(canaries, second_version)
    for device in canaries:
        _metrics(device, second_version, errors=0)
    _metrics(outsider, second_version, errors=100)  # half its attempts fail
    status = release_gate_evaluate(release_id=release["id"])
    assert status["figures"]["devices_reporting"] == 2 and status["figures"]["error_rate"] == 0.0
    assert status["step"] == "complete"


def test_error_rate_is_errors_over_attempts_through_the_gate(api, org, ready_version, second_version):
    devices = _devices(org, 2, ready_version)
    release = _create(api, second_version, gate={"max_error_rate": 0.6}, start=True).json()
    _install(devices, second_version)
    for device in devices:
        _metrics(device, second_version, errors=100)  # 100 successes and 100 failures each
    status = release_gate_evaluate(release_id=release["id"])
    assert status["figures"]["error_rate"] == 0.5 and status["passed"]


def test_a_gate_nobody_reported_to_is_pending_not_healthy(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    phases = [{"percentage": 100, "min_reporting_devices": 0}]
    release = _create(api, second_version, phases=phases, start=True).json()
    _install(devices, second_version)
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "wait" and status["pending"] and not status["passed"]
    assert status["figures"]["devices_pending"] == 3 and status["figures"]["devices_selected"] == 3
    assert Release.objects.get().state == "active"
    detail = api.get(f"/api/v1/releases/{release['id']}/").json()
    assert detail["gate_status"]["figures"]["devices_pending"] == 3


def test_the_soak_clock_starts_at_the_first_report(api, org, ready_version, second_version):
    devices = _devices(org, 2, ready_version)
    phases = [{"percentage": 100, "min_soak_seconds": 3600}]
    release = _create(api, second_version, phases=phases, start=True).json()
    Release.objects.filter(pk=release["id"]).update(phase_started_at=timezone.now() - timedelta(hours=2))
    _install(devices, second_version)
    for device in devices:
        _metrics(device, second_version)
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "wait" and "soaked" in status["reason"]  # reported just now
    assert Release.objects.get().phase_reporting_since is not None


def _offline(device: Device) -> None:
    Device.objects.filter(pk=device.pk).update(last_seen_at=timezone.now() - timedelta(days=1))


def test_the_last_phase_waits_for_online_devices_still_deciding_and_their_refusal_aborts(
    api, org, ready_version, second_version
):
    """One device installs and reports while the others' answers are on their way (a refusal
    comes a check-in later): the release must not complete meanwhile, for once it is completed
    the gate stops looking and their refusals would abort nothing."""
    devices = _devices(org, 3, ready_version)
    release = _create(api, second_version, start=True).json()
    _install(devices[:1], second_version)
    _metrics(devices[0], second_version)
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "wait" and status["figures"]["devices_unsettled"] == 2, status
    _offline(devices[2])  # an offline device is not waited for: it may never come back
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "wait" and status["figures"]["devices_unsettled"] == 1, status
    DeviceReleaseStatus.objects.create(
        release_id=release["id"], device=devices[1], state="refused", reason_code="wrong_device_class"
    )
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "abort" and "wrong_device_class: 1" in status["reason"], status
    assert Release.objects.get(pk=release["id"]).state == "aborted"


def test_the_last_phase_completes_once_every_online_device_answered(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    release = _create(api, second_version, start=True).json()
    _install(devices[:2], second_version)
    _metrics(devices[0], second_version)  # the other installed device has not reported metrics yet
    _offline(devices[2])
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "complete" and status["figures"]["devices_unsettled"] == 0, status
    assert Release.objects.get(pk=release["id"]).state == "completed"


def _ingest(device: Device, version, seq: int, payload: dict) -> None:
    record = IncomingRecord(seq, "metrics", time.time(), str(version.pk), payload)
    telemetry_ingest(device=device, records=[record])


def test_malformed_telemetry_is_skipped_and_counted(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    release = _create(api, second_version, start=True).json()
    _install(devices, second_version)
    for device in devices[:2]:
        _metrics(device, second_version)
    _ingest(devices[2], second_version, 9001, {"inferences": "lots", "errors": [1], "latency_ms_p95": {}})
    _ingest(devices[2], second_version, 9002, {"inferences": 5, "top1_histogram": {"0": "x"}})
    status = release_gate_evaluate(release_id=release["id"])
    assert status["figures"]["records_skipped"] == 2 and status["figures"]["devices_reporting"] == 2
    assert status["step"] == "complete"
    assert fleet_rates(organisation=org)["inferences_per_second"] > 0  # the live figures read on too


def test_one_broken_release_does_not_stop_the_others(api, org, ready_version, second_version):
    devices = _devices(org, 2, ready_version)
    broken = _create(api, ready_version, name="broken", target={"labels": {"tier": "none"}}, start=True)
    Release.objects.filter(pk=broken.json()["id"]).update(current_phase=7)  # no such phase: it raises
    good = _create(api, second_version, name="good", start=True).json()
    _install(devices, second_version)
    for device in devices:
        _metrics(device, second_version)
    results = release_gates_evaluate_all()
    assert [r["release"] for r in results] == [good["id"]]
    assert Release.objects.get(pk=good["id"]).state == "completed"
    failed = Release.objects.get(pk=broken.json()["id"])
    assert failed.state == "active" and failed.gate_status["step"] == "error"
    assert "IndexError" in failed.gate_status["reason"]


def test_a_target_that_matches_nothing_is_refused_unless_allowed(api, org, ready_version):
    _devices(org, 2, ready_version, hardware="rpi4")
    body = {"target": {"filter": "hardware == rpi9"}, "allow_empty": False}
    refused = _create(api, ready_version, **body)
    assert refused.status_code == 400, refused.content
    message = refused.json()["error"]["message"]
    assert "hardware == rpi9" in message and "0 matching devices" in message and "allow_empty" in message
    assert not Release.objects.exists()
    allowed = _create(api, ready_version, **{**body, "allow_empty": True, "start": True})
    assert allowed.status_code == 201 and allowed.json()["devices"]["matching"] == 0
    completing = api.post(f"/api/v1/releases/{allowed.json()['id']}/advance/", {"phase": 1}, format="json")
    assert completing.status_code == 409 and "0 matching devices" in completing.json()["error"]["message"]
    detail = api.get(f"/api/v1/releases/{allowed.json()['id']}/").json()
    assert detail["state"] == "active" and detail["devices"]["matching"] == 0
    preview = api.post("/api/v1/device-filters/preview/", {"filter": "hardware == rpi4"}, format="json")
    assert preview.json()["matching_devices"] == 2


def test_a_canary_keeps_the_version_when_the_fleet_grows(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    phases = [{"percentage": 1, "min_reporting_devices": 50}, {"percentage": 100}]
    # a salt that puts every one of the three at bucket 20 or above, so each newcomer falls below
    # the canary with a chance of at least 1 in 5 (a random salt could leave it near 0)
    salt = next(
        s for s in (f"grow{i}" for i in range(10_000)) if min(bucket(s, str(d.pk)) for d in devices) >= 20
    )
    release = _create(api, second_version, phases=phases, start=True, salt=salt).json()
    canary = _install(devices, second_version)[0]
    for _ in range(100):  # enrol until a newcomer's bucket is below the canary's
        newcomer = _devices(org, 1, ready_version)[0]
        if bucket(salt, str(newcomer.pk)) < bucket(salt, str(canary.pk)):
            break
    else:
        raise AssertionError("no newcomer below the canary")
    status = release_gate_evaluate(release_id=release["id"])
    assert status["figures"]["devices_selected"] == 2  # the newcomer (lowest) and the canary kept
    assert desired_package_for(Device.objects.get(pk=canary.pk)).version == second_version
    assert desired_package_for(newcomer).version == second_version
