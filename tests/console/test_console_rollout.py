"""The console's rollout pages: create a release with phases and a gate, watch it, control it."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from fleet.models import Device, DeviceGroup
from fleet.services import device_enrol, enrolment_token_create
from playwright.sync_api import expect
from releases.models import Release

from tests.console.test_console_browser import _login, page  # noqa: F401


@pytest.fixture
def console(admin) -> Client:
    client = Client()
    assert client.login(username="alice", password="correct horse")
    return client


def _form(version, **extra) -> dict:
    data = {
        "name": "staged",
        "version": str(version.pk),
        "filter": "hardware == rpi4",
        "phases": "1, 10, 50, 100",
        "min_soak_seconds": "600",
        "min_reporting_devices": "5",
        "on_failure": "abort",
        "max_error_rate": "0.01",
        "max_latency_p95_ratio": "1.3",
        "window_cron": "0 2 * * *",
        "window_duration_seconds": "3600",
        "window_timezone": "Europe/Berlin",
        "priority": "2",
        "allow_empty": "on",  # made before its devices enrol; test_release_preview.py tests the refusal
        "start": "on",
    }
    return {**data, **extra}


def test_create_watch_and_control_a_release(console, ready_version):
    response = console.post("/releases/new/", _form(ready_version), follow=True)
    assert response.status_code == 200
    release = Release.objects.get()
    assert release.state == "active"
    assert [p["percentage"] for p in release.phases] == [1, 10, 50, 100]
    assert release.gate["on_failure"] == "abort" and release.gate["max_error_rate"] == 0.01
    assert release.window == {"cron": "0 2 * * *", "duration_seconds": 3600, "timezone": "Europe/Berlin"}
    page_text = response.content.decode()
    assert "hardware == rpi4" in page_text and "current" in page_text and "events and audit log" in page_text

    gate = console.post(f"/releases/{release.pk}/gate/", follow=True).content.decode()
    assert "0 of 5 devices reporting" in gate

    advanced = console.post(
        f"/releases/{release.pk}/advance/",
        {"expected_revision": release.revision, "phase": 1, "reason": "manual push", "next": "detail"},
        follow=True,
    ).content.decode()
    assert "advance done" in advanced and "manual push" in advanced
    release.refresh_from_db()
    assert release.current_phase == 1

    stale = console.post(
        f"/releases/{release.pk}/pause/", {"expected_revision": 0, "next": "detail"}, follow=True
    ).content.decode()
    assert "changed since revision 0" in stale
    release.refresh_from_db()
    assert release.state == "active"


def test_bad_filter_is_shown_with_its_column_and_nothing_is_created(console, ready_version):
    response = console.post("/releases/new/", _form(ready_version, filter="hardware == rpi4 and"))
    assert response.status_code == 200
    assert re.search(r"expected a field name.*column 21", response.content.decode())
    assert not Release.objects.exists()
    mixed = console.post("/releases/new/", _form(ready_version, phases="10, five"))
    assert "Write the phases as numbers" in mixed.content.decode()


def test_groups_page_creates_dynamic_groups(console, org):
    response = console.post(
        "/groups/",
        {"name": "eu pis", "kind": "dynamic", "filter": "region in [eu-west, eu-north]"},
        follow=True,
    )
    assert "Group eu pis created" in response.content.decode()
    assert DeviceGroup.objects.get().filter == "region in [eu-west, eu-north]"
    bad = console.post("/groups/", {"name": "broken", "kind": "dynamic", "filter": "region in ["})
    assert "column" in bad.content.decode() and DeviceGroup.objects.count() == 1


@pytest.mark.browser
def test_release_page_in_a_browser(transactional_db, admin, ready_version, live_server, page):  # noqa: F811
    _login(page, live_server)
    page.get_by_role("link", name="New release").click()
    page.get_by_label("Name").fill("canary")
    page.get_by_label("Phases").fill("5, 100")
    page.get_by_label("Allow empty").check()  # no device has enrolled
    page.get_by_role("button", name="Create release").click()
    expect(page.locator("#release-state")).to_contain_text("Active")
    expect(page.locator("#phases")).to_contain_text("current")
    page.get_by_label("Reason").fill("looks fine")
    page.get_by_role("button", name="Advance").click()
    expect(page.locator(".messages")).to_contain_text("advance done")
    expect(page.locator("#audit")).to_contain_text("looks fine")
    page.get_by_role("button", name="Rollback").click()
    expect(page.locator("#release-state")).to_contain_text("Rolled back")
    assert Release.objects.get().events.last().actor.username == "alice"


def test_pin_a_device_and_a_group_from_the_console(console, org, ready_version):
    token = enrolment_token_create(organisation=org).token
    device = device_enrol(token=token, name="pi", attributes={}, labels={}).device
    dashboard = console.get("/").content.decode()
    assert f'data-device="{device.pk}"' in dashboard and str(ready_version) in dashboard
    done = console.post(f"/devices/{device.pk}/pin/", {"version": str(ready_version.pk)}, follow=True)
    assert "pin saved" in done.content.decode()
    assert Device.objects.get().pinned_version == ready_version
    console.post(f"/devices/{device.pk}/pin/", {"version": ""})
    assert Device.objects.get().pinned_version is None
    bad = console.post(f"/devices/{device.pk}/pin/", {"version": "not-a-version"}, follow=True)
    assert "No version not-a-version" in bad.content.decode()

    console.post("/groups/", {"name": "frozen", "kind": "static", "device_ids": str(device.pk)})
    group = DeviceGroup.objects.get()
    console.post(f"/groups/{group.pk}/pin/", {"version": str(ready_version.pk)})
    group.refresh_from_db()
    assert group.pinned_version == ready_version and list(group.members.all()) == [device]
