"""Rollout policies through the REST API and the services behind it: targeting, phases gated
by telemetry, abort and rollback, pins, groups, download-only, conflicts and the audit log."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from fleet.models import Device
from fleet.services import device_enrol, device_record_check_in, enrolment_token_create
from registry.models import ModelVersion
from registry.services import conversion_run
from releases.models import Release
from releases.selectors import desired_package_for
from releases.services import release_gate_evaluate
from rest_framework.test import APIClient
from telemetry.services import IncomingRecord, telemetry_ingest

from converter.samples import build_image_classifier
from tests.platform.conftest import onnx_bytes, upload


@pytest.fixture
def second_version(api, ready_version) -> ModelVersion:
    created = upload(api, ready_version.model_id, "v2", onnx_bytes(build_image_classifier()))
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY
    return version


def _devices(org, count: int, running: ModelVersion | None, **attributes) -> list[Device]:
    devices = []
    for i in range(count):
        token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
        device = device_enrol(token=token, name=f"dev-{i}", attributes=attributes, labels={}).device
        if running is not None:
            device = device_record_check_in(
                device=device, attributes=attributes, running_version_id=str(running.pk)
            )
        devices.append(device)
    return devices


_seq: dict[str, int] = {}


def _metrics(device: Device, version: ModelVersion, *, errors: int = 0, p95: float = 10.0, count: int = 1):
    records = []
    for _ in range(count):
        _seq[str(device.pk)] = _seq.get(str(device.pk), 0) + 1
        payload = {"inferences": 100, "errors": errors, "latency_ms_p50": p95 / 2, "latency_ms_p95": p95}
        records.append(IncomingRecord(_seq[str(device.pk)], "metrics", time.time(), str(version.pk), payload))
    telemetry_ingest(device=device, records=records)


def _create(api, version, **body):
    # most releases here are made before (or without) their devices: the refusal of a target
    # that matches nothing is tested in test_rollout_truth.py
    body = {"name": "r", "version": str(version.pk), "allow_empty": True, **body}
    return api.post("/api/v1/releases/", body, format="json")


def _install(devices: list[Device], version: ModelVersion) -> list[Device]:
    """The devices whose offer is `version` install it (as their agent would) and say so at check-in."""
    moved = []
    for device in devices:
        device.refresh_from_db()
        desired = desired_package_for(device)
        if desired is not None and desired.version == version:
            moved.append(
                device_record_check_in(device=device, attributes={}, running_version_id=str(version.pk))
            )
    return moved


def test_create_with_every_policy_field_and_read_it_back(api, org, ready_version):
    group = api.post(
        "/api/v1/device-groups/",
        {"name": "pis", "kind": "dynamic", "filter": "hardware==rpi4"},
        format="json",
    ).json()
    body = {
        "target": {"filter": 'ram_mb >= 2048 and app_version matches ">=1.2"', "group_ids": [group["id"]]},
        "phases": [{"percentage": 10, "min_soak_seconds": 60}, {"percentage": 100, "manual_approval": True}],
        "gate": {"max_error_rate": 0.05, "max_latency_p95_ratio": 1.2, "on_failure": "abort"},
        "window": {"cron": "0 2 * * *", "duration_seconds": 3600, "timezone": "Europe/Berlin"},
        "download_only": True,
        "priority": 3,
    }
    created = _create(api, ready_version, **body)
    assert created.status_code == 201, created.content
    release = created.json()
    assert release["phase"] == 1 and release["percentage"] == 10 and release["revision"] == 0
    assert release["phases"][1] == {
        "percentage": 100,
        "min_soak_seconds": 0,
        "min_reporting_devices": 0,
        "manual_approval": True,
    }
    assert release["gate"]["on_failure"] == "abort" and release["download_only"] is True
    assert release["window"]["timezone"] == "Europe/Berlin"
    assert group["device_ids"] == []


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"target": {"filter": "hardware == "}}, 400, "column 13"),
        ({"target": {"filter": "ram_mb > 1 region == eu"}}, 400, "expected 'and', 'or'"),
        ({"target": {"percentage": 10}, "phases": [{"percentage": 50}]}, 400, "not both"),
        ({"phases": [{"percentage": 50}, {"percentage": 10}]}, 400, "must grow"),
        ({"phases": [{"percentage": 50, "bake": 1}]}, 400, None),
        ({"gate": {"max_error_rate": 0.1, "max_errors": 1}}, 400, None),
        ({"gate": {"on_failure": "explode"}}, 400, None),
        ({"window": {"cron": "nightly", "duration_seconds": 600}}, 400, "cron"),
        (
            {"window": {"cron": "0 2 * * *", "duration_seconds": 600, "timezone": "Nowhere/City"}},
            400,
            "timezone",
        ),
        ({"target": {"group_ids": ["00000000-0000-0000-0000-000000000001"]}}, 400, "no device group"),
        ({"targets": {}}, 400, None),
    ],
)
def test_bad_policies_are_refused_clearly_and_store_nothing(api, ready_version, body, status, message):
    response = _create(api, ready_version, **body)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    if message:
        assert message in error["message"]
    assert Release.objects.count() == 0


def test_staged_release_advances_through_its_gates_to_completion(api, org, ready_version, second_version):
    devices = _devices(org, 40, ready_version, hardware="rpi4")
    phases = [{"percentage": p, "min_reporting_devices": 1} for p in (10, 50, 100)]
    release = _create(api, second_version, phases=phases, start=True).json()
    url = f"/api/v1/releases/{release['id']}/gate/"
    assert api.post(url).json()["step"] == "wait"  # nobody reports the new version yet
    seen_phases = []
    for _ in range(6):
        moved = _install(devices, second_version)
        for device in devices:
            device.refresh_from_db()
            _metrics(device, device.running_version)
        status = api.post(url).json()
        seen_phases.append(status["phase"])
        state = api.get(f"/api/v1/releases/{release['id']}/").json()
        if state["state"] == "completed":
            break
        assert moved, "every phase moves some devices"
    assert state["state"] == "completed"
    assert seen_phases == [1, 2, 3]
    on_new = sum(d.running_version_id == second_version.pk for d in Device.objects.all())
    assert on_new == 40
    assert state["devices"] == {
        "on_release_version": 40,
        "on_other_versions": 0,
        "matching": 40,
        "by_state": {"running": 40},  # from their check-ins: these devices send no update status
    }
    gate_events = [e for e in state["events"] if e["actor"] is None]
    assert [(e["action"], e["from_phase"], e["to_phase"]) for e in gate_events] == [
        ("advance", 1, 2),
        ("advance", 2, 3),
        ("advance", 3, 3),
    ]
    assert gate_events[0]["details"]["figures"]["devices_reporting"] >= 1


def test_faulty_release_is_aborted_by_its_gate_and_devices_go_back(api, org, ready_version, second_version):
    devices = _devices(org, 30, ready_version)
    body = {
        "phases": [{"percentage": 50, "min_reporting_devices": 3}, {"percentage": 100}],
        "gate": {"max_error_rate": 0.05, "on_failure": "abort"},
        "start": True,
    }
    release = _create(api, second_version, **body).json()
    moved = _install(devices, second_version)
    assert 5 <= len(moved) <= 25
    for device in devices:
        device.refresh_from_db()
        faulty = device.running_version_id == second_version.pk
        _metrics(device, device.running_version, errors=40 if faulty else 0)
    status = api.post(f"/api/v1/releases/{release['id']}/gate/").json()
    assert status["step"] == "abort" and "inference error rate" in status["reason"]
    assert api.get(f"/api/v1/releases/{release['id']}/").json()["state"] == "aborted"
    for device in moved:
        desired = desired_package_for(device)
        assert desired.rollback and desired.version == ready_version
        assert desired.release.pk == Release.objects.get().pk
    untouched = [d for d in devices if d.pk not in {m.pk for m in moved}]
    assert all(desired_package_for(d) is None for d in untouched)  # never reached: nothing to undo
    _install(moved, ready_version)
    assert all(d.running_version_id == ready_version.pk for d in Device.objects.all())


def test_failing_gate_pauses_by_default(api, org, ready_version, second_version):
    devices = _devices(org, 5, ready_version)
    release = _create(api, second_version, gate={"max_latency_p95_ratio": 1.5}, start=True).json()
    _install(devices, second_version)
    _metrics(devices[0], second_version, p95=50.0)
    other = _devices(org, 1, ready_version)[0]
    _metrics(other, ready_version, p95=10.0)
    status = api.post(f"/api/v1/releases/{release['id']}/gate/").json()
    assert status["step"] == "pause" and status["figures"]["latency_p95_ratio"] == 5.0
    assert Release.objects.get().state == "paused"


def test_manual_controls_are_idempotent_and_audited(api, org, ready_version, second_version):
    _devices(org, 1, ready_version)  # a release that matches no device never completes
    phases = [{"percentage": 10}, {"percentage": 100, "manual_approval": True}]
    release_id = _create(api, second_version, phases=phases, start=True).json()["id"]
    act = lambda action, **body: api.post(f"/api/v1/releases/{release_id}/{action}/", body, format="json")  # noqa: E731
    assert act("advance", phase=1, reason="looks good").json()["phase"] == 2
    assert act("advance", phase=1).json()["phase"] == 2  # the same click twice moves one phase
    assert act("advance", phase=2).json()["state"] == "completed"
    assert act("rollback", reason="customer complaint").json()["state"] == "rolled_back"
    assert act("rollback").status_code == 200
    refused = act("resume")
    assert (
        refused.status_code == 409
        and "Cannot resume a release that is rolled_back" in refused.json()["error"]["message"]
    )
    events = api.get(f"/api/v1/releases/{release_id}/").json()["events"]
    assert [e["action"] for e in events] == ["create", "start", "advance", "advance", "rollback"]
    assert events[2]["reason"] == "looks good" and events[2]["actor"] == "alice"
    assert act("advance", bogus=1).status_code == 400


def test_stale_revision_is_a_conflict(api, ready_version):
    release = _create(api, ready_version, start=True).json()
    url = f"/api/v1/releases/{release['id']}/"
    assert (
        api.post(url + "pause/", {"expected_revision": release["revision"]}, format="json").status_code == 200
    )
    stale = api.post(url + "abort/", {"expected_revision": release["revision"]}, format="json")
    assert stale.status_code == 409
    assert "changed since revision 1" in stale.json()["error"]["message"]
    assert "pause by alice" in stale.json()["error"]["message"]
    assert Release.objects.get().state == "paused"


@pytest.mark.django_db(transaction=True)
def test_concurrent_transitions_exactly_one_wins(admin, ready_version):
    release = _create(_client(admin), ready_version, start=True).json()
    results: dict[str, int] = {}
    barrier = threading.Barrier(2)

    def act(action: str) -> None:
        client = _client(admin)
        barrier.wait()
        response = client.post(
            f"/api/v1/releases/{release['id']}/{action}/",
            {"expected_revision": release["revision"]},
            format="json",
        )
        results[action] = response.status_code
        connection.close()

    threads = [threading.Thread(target=act, args=(a,)) for a in ("pause", "abort")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [200, 409], results
    winner = next(a for a, code in results.items() if code == 200)
    assert Release.objects.get().state == {"pause": "paused", "abort": "aborted"}[winner]
    assert Release.objects.get().events.count() == 3  # create, start, and the winner


def _client(admin) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {admin[1]}")
    return client


def test_download_only_then_activate(api, org, ready_version, second_version):
    device = _devices(org, 1, ready_version)[0]
    release = _create(api, second_version, download_only=True, start=True).json()
    desired = desired_package_for(device)
    assert desired.download_only and desired.version == second_version
    activated = api.post(f"/api/v1/releases/{release['id']}/activate/").json()
    assert activated["download_only"] is False and activated["events"][-1]["action"] == "activate"
    assert desired_package_for(device).download_only is False


def test_pins_groups_and_windows(api, org, ready_version, second_version):
    lab, other = _devices(org, 2, ready_version, hardware="rpi4")
    _create(api, second_version, start=True)
    window = {"cron": "30 1 * * *", "duration_seconds": 1800, "timezone": "UTC"}
    group = api.post(
        "/api/v1/device-groups/",
        {
            "name": "frozen",
            "device_ids": [str(lab.pk)],
            "pinned_version": str(ready_version.pk),
            "window": window,
        },
        format="json",
    )
    assert group.status_code == 201, group.content
    desired = desired_package_for(lab)
    assert desired.version == ready_version and desired.release is None and desired.window == window
    assert desired_package_for(other).version == second_version
    pinned = api.post(f"/api/v1/devices/{other.pk}/pin/", {"version": str(ready_version.pk)}, format="json")
    assert pinned.json()["pinned_version_info"]["label"] == "v1"
    assert desired_package_for(Device.objects.get(pk=other.pk)).version == ready_version
    api.post(f"/api/v1/devices/{other.pk}/pin/", {"version": None}, format="json")
    assert desired_package_for(Device.objects.get(pk=other.pk)).version == second_version
    bad = api.post(
        "/api/v1/device-groups/", {"name": "dyn", "kind": "dynamic", "filter": "hardware =="}, format="json"
    )
    assert bad.status_code == 400 and "column" in bad.json()["error"]["message"]
    duplicate = api.post("/api/v1/device-groups/", {"name": "frozen"}, format="json")
    assert duplicate.status_code == 400 and "exists already" in duplicate.json()["error"]["message"]


def test_dynamic_group_takes_devices_that_enrol_later(api, org, ready_version, second_version):
    group = api.post(
        "/api/v1/device-groups/",
        {"name": "pi5", "kind": "dynamic", "filter": "hardware == rpi5"},
        format="json",
    ).json()
    _create(api, second_version, target={"group_ids": [group["id"]]}, start=True)
    late = _devices(org, 1, ready_version, hardware="rpi5")[0]
    other = _devices(org, 1, ready_version, hardware="rpi4")[0]
    assert desired_package_for(late).version == second_version
    assert desired_package_for(other) is None
    assert api.get(f"/api/v1/device-groups/{group['id']}/").json()["device_ids"] == [str(late.pk)]
    in_use = api.delete(f"/api/v1/device-groups/{group['id']}/")
    assert in_use.status_code == 400 and "targeted by a release" in in_use.json()["error"]["message"]


def test_gate_waits_for_soak_time(api, org, ready_version, second_version):
    devices = _devices(org, 3, ready_version)
    phases = [{"percentage": 100, "min_soak_seconds": 3600}]
    release = _create(api, second_version, phases=phases, start=True).json()
    _install(devices, second_version)
    for d in devices:
        _metrics(d, second_version)
    status = release_gate_evaluate(release_id=release["id"])
    assert status["step"] == "wait" and "soaked" in status["reason"]
    # the soak clock runs from the phase's first device report
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Release.objects.filter(pk=release["id"]).update(
        phase_started_at=two_hours_ago, phase_reporting_since=two_hours_ago
    )
    assert release_gate_evaluate(release_id=release["id"])["step"] == "complete"
    assert Release.objects.get().state == "completed"


def test_filter_preview_shows_matches_and_points_at_errors(api, org, ready_version):
    pi, _ = (
        _devices(org, 1, ready_version, hardware="rpi4", ram_mb="4096")[0],
        _devices(org, 1, None, hardware="x86"),
    )
    preview = api.post(
        "/api/v1/device-filters/preview/", {"filter": "hardware==rpi4 and ram_mb>=2048"}, format="json"
    )
    assert preview.json() == {
        "filter": "hardware == rpi4 and ram_mb >= 2048",
        "matching_devices": 1,
        "device_ids": [str(pi.pk)],
    }
    bad = api.post("/api/v1/device-filters/preview/", {"filter": "ram_mb >= "}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_filter"
    assert "column 11" in bad.json()["error"]["message"]


def test_periodic_task_evaluates_every_active_release(api, org, ready_version, second_version):
    from releases.tasks import evaluate_release_gates

    devices = _devices(org, 4, ready_version)
    active = _create(
        api, second_version, phases=[{"percentage": 100, "min_reporting_devices": 4}], start=True
    ).json()
    draft = _create(api, ready_version, name="draft").json()
    _install(devices, second_version)
    for device in devices:
        _metrics(device, second_version)
    assert evaluate_release_gates.apply().get() == 1  # the draft is not looked at
    assert Release.objects.get(pk=active["id"]).state == "completed"
    assert Release.objects.get(pk=draft["id"]).gate_status == {}
    assert evaluate_release_gates.apply().get() == 0  # nothing active is left: idempotent


def test_a_baseline_of_another_model_kind_is_no_yardstick(api, org, ready_version, second_version):
    """A first LLM release onto devices that run a classifier: the chat's time to first token is
    not compared with the classifier's latency (the ratio waits for a baseline of its kind)."""
    devices = _devices(org, 5, ready_version)
    ModelVersion.objects.filter(pk=second_version.pk).update(kind=ModelVersion.Kind.LLM)
    phases = [{"percentage": 100, "min_reporting_devices": 3}]  # waits: one device reports
    release = _create(
        api, second_version, phases=phases, gate={"max_latency_p95_ratio": 1.5}, start=True
    ).json()
    _install(devices, second_version)
    _metrics(devices[0], second_version, p95=400.0)
    other = _devices(org, 1, ready_version)[0]
    _metrics(other, ready_version, p95=10.0)
    status = api.post(f"/api/v1/releases/{release['id']}/gate/").json()
    figures = status["figures"]
    assert figures["latency_p95_ratio"] is None and figures["baseline_devices_reporting"] == 0
    assert status["step"] == "wait" and Release.objects.get().state == "active"

    ModelVersion.objects.filter(pk=ready_version.pk).update(kind=ModelVersion.Kind.LLM_ADAPTER)
    status = api.post(f"/api/v1/releases/{release['id']}/gate/").json()  # a chat baseline: compared
    assert (
        status["figures"]["latency_p95_ratio"] == 40.0
        and status["figures"]["baseline_devices_reporting"] == 1
    )


def test_a_refusal_seen_first_as_telemetry_aborts_like_one_seen_as_a_status(
    api, org, ready_version, second_version
):
    """An agent reports a refusal twice: as an activation record (telemetry) and in its next
    check-in's update status. Whichever arrives first, the gate aborts: before, a record alone
    failed the activation rate and paused the release, and the status arrived too late."""
    devices = _devices(org, 2, ready_version)
    release = _create(api, second_version, start=True).json()
    _seq[str(devices[0].pk)] = _seq.get(str(devices[0].pk), 0) + 1
    refusal = {
        "ok": False,
        "version_id": str(second_version.pk),
        "reason": "signed for device class 'jetson'",
        "stage": "verify",
        "code": "wrong_device_class",
        "refused": True,
    }
    record = IncomingRecord(
        _seq[str(devices[0].pk)], "activation", time.time(), str(ready_version.pk), refusal
    )
    telemetry_ingest(device=devices[0], records=[record])  # filed under the version it still runs
    status = api.post(f"/api/v1/releases/{release['id']}/gate/").json()
    assert status["step"] == "abort", status
    assert "1 device(s) refused or failed the update (wrong_device_class: 1)" in status["reason"]
    assert Release.objects.get().state == "aborted"


def test_a_failed_activation_followed_by_a_success_is_no_refusal(api, org, ready_version, second_version):
    """A device whose first activation of the version failed and whose retry worked (its latest
    activation record is a success) does not count against the release."""
    device = _devices(org, 1, ready_version)[0]
    phases = [{"percentage": 100, "min_reporting_devices": 2}]  # waits: the gate only counts
    release = _create(api, second_version, phases=phases, start=True).json()
    outcomes = [
        ({"ok": False, "stage": "health", "code": "health_check_failed"}, ready_version),
        ({"ok": True, "stage": "health"}, second_version),
    ]
    for payload, filed_under in outcomes:
        _seq[str(device.pk)] = _seq.get(str(device.pk), 0) + 1
        payload = {**payload, "version_id": str(second_version.pk)}
        record = IncomingRecord(_seq[str(device.pk)], "activation", time.time(), str(filed_under.pk), payload)
        telemetry_ingest(device=device, records=[record])
    status = api.post(f"/api/v1/releases/{release['id']}/gate/").json()
    assert status["step"] == "wait" and status["figures"]["devices_refused"] == 0, status
