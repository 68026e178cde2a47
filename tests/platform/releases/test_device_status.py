"""Per-device release status: agents report their update at every check-in over the real gRPC
gateway; the release shows each device's state with its reason (REST, audit log), and a
refusal fails the release's gate so it ends aborted instead of waiting forever."""

from __future__ import annotations

import math
import time

import grpc
import pytest
from fleet.models import Device
from fleet.services import enrolment_token_create
from hypothesis import given, settings
from hypothesis import strategies as st
from releases.device_status import InvalidUpdateStatus, update_report_from
from releases.models import DeviceReleaseStatus, Release
from releases.services import release_create, release_gate_evaluate

from agent.client import GatewayClient
from deploy.proto import agent_pb2
from tests.platform.gateway.test_gateway import ATTRS, gateway  # noqa: F401
from tests.platform.releases.test_rollout_api import second_version  # noqa: F401

UUID = "0b7c3f2e-3c1d-4d35-9f5e-2f4f0c7f9a11"


def _client(org, gateway, name: str) -> tuple[GatewayClient, str]:  # noqa: F811
    client = GatewayClient(gateway)
    reply = client.enrol(enrolment_token_create(organisation=org).token, name, ATTRS)
    client.credential = reply.credential
    return client, reply.device_id


def _status(state: str, version, release=None, **fields) -> agent_pb2.UpdateStatus:
    return agent_pb2.UpdateStatus(
        state=state,
        version_id=str(version.pk),
        release_id=str(release.pk) if release else "",
        at=time.time(),
        **fields,
    )


def test_a_refusing_device_shows_refused_with_its_reason_and_aborts_the_release(
    org,
    admin,
    api,
    ready_version,
    second_version,  # noqa: F811
    gateway,  # noqa: F811
):
    devices = {name: _client(org, gateway, name) for name in ("ok-1", "refuser", "silent")}
    for client, _ in devices.values():
        client.check_in(ATTRS, str(ready_version.pk), ready_version.package.sha256)  # all run v1
    release = release_create(
        organisation=org,
        version=second_version,
        name="v2",
        target={"labels": {"fleet": "demo"}},
        actor=admin[0],
        start=True,
    )
    url = f"/api/v1/releases/{release.pk}/devices/"
    assert {d["state"] for d in api.get(url).json()["results"]} == {"pending"}  # nobody reported

    ok, refuser = devices["ok-1"][0], devices["refuser"][0]
    ok.check_in(ATTRS, str(ready_version.pk), "", update=_status("downloading", second_version, release))
    message = "the package is signed for device class 'jetson'; this device is 'pi4'"
    refusal = _status("refused", second_version, release, reason_code="device_class", message=message)
    refuser.check_in(ATTRS, str(ready_version.pk), "", update=refusal)
    refuser.check_in(ATTRS, str(ready_version.pk), "", update=refusal)  # the next check-in repeats it

    rows = {d["device_name"]: d for d in api.get(url).json()["results"]}
    assert rows["refuser"]["state"] == "refused"
    assert rows["refuser"]["reason_code"] == "device_class" and rows["refuser"]["message"] == message
    assert rows["refuser"]["reported_at"] and rows["refuser"]["updated_at"]
    assert rows["ok-1"]["state"] == "downloading" and rows["silent"]["state"] == "pending"
    assert list(rows)[0] == "refuser"  # failures first
    detail = api.get(f"/api/v1/releases/{release.pk}/").json()
    assert detail["devices"]["by_state"] == {"refused": 1, "downloading": 1, "pending": 1}
    refused_only = api.get(url, {"state": "refused"}).json()
    assert refused_only["count"] == 1 and refused_only["results"][0]["device_name"] == "refuser"
    page = api.get(url, {"limit": 1, "offset": 1}).json()
    assert page["count"] == 3 and len(page["results"]) == 1
    bad = api.get(url, {"state": "exploded"})
    assert bad.status_code == 400 and "exploded" in bad.json()["error"]["message"]

    audit = [e for e in detail["events"] if e["action"] == "device_refused"]
    assert len(audit) == 1  # a repeated report is not a new event
    assert "refuser" in audit[0]["reason"] and "device_class" in audit[0]["reason"]

    status = release_gate_evaluate(release_id=release.pk)
    assert status["step"] == "abort"
    assert "1 device(s) refused or failed the update (device_class: 1)" in status["reason"]
    release.refresh_from_db()
    assert release.state == Release.State.ABORTED
    abort = release.events.get(action="abort")
    assert "device_class" in abort.reason and abort.actor is None

    # the device that had moved is told to go back; the refusal stays visible on the release
    ok.check_in(ATTRS, str(second_version.pk), "", update=_status("running", second_version, release))
    back = ok.check_in(ATTRS, str(second_version.pk), "").desired
    assert back.rollback and back.version_id == str(ready_version.pk)
    assert api.get(url, {"state": "refused"}).json()["count"] == 1


def test_a_rolled_back_device_counts_as_a_failure_even_with_healthy_peers(
    org,
    admin,
    ready_version,
    second_version,  # noqa: F811
    gateway,  # noqa: F811
):
    client, device_id = _client(org, gateway, "flaky")
    release = release_create(
        organisation=org, version=second_version, name="v2", target={}, actor=admin[0], start=True
    )
    # no release id from the agent: the report maps to the release of that version
    failed = _status("rolled_back", second_version, reason_code="health_check", message="self-test failed")
    client.check_in(ATTRS, str(ready_version.pk), "", update=failed)
    row = DeviceReleaseStatus.objects.get(device_id=device_id)
    assert row.release_id == release.pk and row.state == "rolled_back"
    client.check_in(ATTRS, str(ready_version.pk), "", update=failed)  # the same report again
    assert DeviceReleaseStatus.objects.get(pk=row.pk).updated_at == row.updated_at  # nothing written
    assert release_gate_evaluate(release_id=release.pk)["step"] == "abort"


def test_a_report_about_an_unreleased_version_is_kept_nowhere(org, ready_version, gateway):  # noqa: F811
    client, _ = _client(org, gateway, "pinned")
    client.check_in(ATTRS, "", "", update=_status("running", ready_version))
    client.check_in(ATTRS, "", "", update=agent_pb2.UpdateStatus(state="idle"))
    assert not DeviceReleaseStatus.objects.exists()


HOSTILE = [
    ("state", {"state": "exploded"}),
    ("state", {"state": "RUNNING"}),
    ("version_id", {"version_id": "../../etc/passwd"}),
    ("version_id", {"version_id": UUID.replace("-", "")}),  # UUID-shaped means the dashed form
    ("release_id", {"release_id": "x" * 10_000}),
    ("reason_code", {"reason_code": "Device Class!"}),
    ("reason_code", {"reason_code": "a" * 33}),
    ("message", {"message": "m" * 501}),
    ("message", {"message": "nul\x00byte"}),
    ("at", {"at": math.nan}),
    ("at", {"at": math.inf}),
    ("at", {"at": -1.0}),
    ("at", {"at": 1e13}),
    ("assignment_counter", {"assignment_counter": 2**64 - 1}),
    ("version_id", {"version_id": ""}),  # refused without a version
]


@pytest.mark.parametrize(("field", "change"), HOSTILE, ids=[f"{f}-{i}" for i, (f, _) in enumerate(HOSTILE)])
def test_hostile_update_fields_are_refused_naming_the_field_and_store_nothing(
    org,
    admin,
    ready_version,
    gateway,  # noqa: F811
    field,
    change,
):
    client, device_id = _client(org, gateway, "hostile")
    release = release_create(
        organisation=org, version=ready_version, name="v1", target={}, actor=admin[0], start=True
    )
    fields = {
        "state": "refused",
        "version_id": str(ready_version.pk),
        "release_id": str(release.pk),
        "reason_code": "verification",
        "message": "bad signature",
        "at": time.time(),
        **change,
    }
    with pytest.raises(grpc.RpcError) as caught:
        client.check_in(ATTRS, str(ready_version.pk), "", update=agent_pb2.UpdateStatus(**fields))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"update.{field}" in caught.value.details()
    assert not DeviceReleaseStatus.objects.exists() and not release.events.filter(
        action__startswith="device_"
    )
    assert Device.objects.get(pk=device_id).running_version_id is None  # the check-in stored nothing


@settings(max_examples=200, deadline=None)
@given(
    state=st.text(max_size=20),
    version_id=st.one_of(st.just(UUID), st.text(max_size=40)),
    release_id=st.one_of(st.just(""), st.text(max_size=40)),
    counter=st.integers(min_value=0, max_value=2**64 - 1),
    reason_code=st.text(max_size=40),
    message=st.text(max_size=600),
    at=st.floats(allow_nan=True, allow_infinity=True),
)
def test_update_report_from_accepts_or_names_a_field(
    state, version_id, release_id, counter, reason_code, message, at
):
    try:
        report = update_report_from(
            state=state,
            version_id=version_id,
            release_id=release_id,
            assignment_counter=counter,
            reason_code=reason_code,
            message=message,
            at=at,
        )
    except InvalidUpdateStatus as exc:
        assert str(exc).startswith("update.") and list(exc.fields)[0].startswith("update.")
        return
    assert report.state in DeviceReleaseStatus.State.values and report.state != "pending"
    assert len(report.message) <= 500 and len(report.reason_code) <= 32
    assert report.at is None or math.isfinite(report.at.timestamp())


def test_the_console_release_page_shows_each_device_escaped(org, admin, viewer, ready_version):
    from django.test import Client
    from fleet.services import device_enrol
    from releases.device_status import device_status_record

    release = release_create(
        organisation=org, version=ready_version, name="v1", target={}, actor=admin[0], start=True
    )
    token = enrolment_token_create(organisation=org).token
    device = device_enrol(token=token, name="<script>alert(1)</script>", attributes={}, labels={}).device
    hostile = '<img src=x onerror="alert(2)">'
    report = update_report_from(
        state="failed",
        version_id=str(ready_version.pk),
        release_id=str(release.pk),
        assignment_counter=7,
        reason_code="disk_space",
        message=hostile,
        at=time.time(),
    )
    device_status_record(device=device, report=report)
    client = Client()
    client.force_login(viewer[0])
    html = client.get(f"/releases/{release.pk}/").content.decode()
    section = html[html.index('id="device-status"') :]
    assert "device-state-failed" in section and "disk_space" in section
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert hostile not in html and "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in section


@settings(max_examples=200, deadline=None)
@given(
    state=st.sampled_from(["idle", "running", "refused", "exploded", ""]),
    version_id=st.one_of(st.just(UUID), st.text(max_size=40)),
    release_id=st.one_of(st.just(UUID), st.text(max_size=40)),
    reason_code=st.text(max_size=60),
    message=st.text(max_size=900),
    at=st.floats(allow_nan=True, allow_infinity=True),
    counter=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_whatever_the_agent_recorded_it_sends_what_the_gateway_accepts(
    state, version_id, release_id, reason_code, message, at, counter
):
    from agent.update_status import Outcome, update_status

    latest = Outcome(state, version_id, release_id, reason_code, message, at, counter)
    status = update_status(
        lifecycle_state="idle", offer=None, counter=0, entered_at=0.0, running_version="", latest=latest
    )
    report = update_report_from(
        state=status.state,
        version_id=status.version_id,
        release_id=status.release_id,
        assignment_counter=status.assignment_counter,
        reason_code=status.reason_code,
        message=status.message,
        at=status.at,
    )
    assert report.state in {state, "idle"}
