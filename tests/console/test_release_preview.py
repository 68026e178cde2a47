"""The New release form previews its target (matching devices, the version's fit) and refuses a
target that matches nothing unless "Allow empty" is ticked, or a version that does not fit."""

# ruff: noqa: F811 - the tests take imported fixtures as arguments
from __future__ import annotations

import re

import pytest
from django.test import Client
from playwright.sync_api import expect
from releases.models import Release

from tests.console.test_console_browser import _login, page  # noqa: F401
from tests.console.test_console_rollout import _form
from tests.platform.releases.test_compatibility import _converted
from tests.platform.releases.test_rollout_api import _devices


@pytest.fixture
def console(admin) -> Client:
    client = Client()
    assert client.login(username="alice", password="correct horse")
    return client


def _preview(console: Client, **params):
    return console.get("/releases/new/preview/", params)


def test_the_preview_counts_matching_devices_and_names_a_bad_filter(console, org, ready_version):
    _devices(org, 3, ready_version, hardware="rpi4")
    _devices(org, 1, ready_version, hardware="jetson")
    assert _preview(console, filter="hardware == rpi4").json() == {"matching": 3}
    assert _preview(console, filter="hardware == rpi9").json() == {"matching": 0}
    assert _preview(console).json() == {"matching": 4}  # no target: the whole fleet
    bad = _preview(console, filter="hardware == rpi4 and")
    assert bad.status_code == 400 and re.search(r"expected a field name.*column 21", bad.json()["error"])
    unknown = _preview(console, version="not-a-version")
    assert unknown.status_code == 400 and "No converted version" in unknown.json()["error"]


def test_the_preview_gives_the_versions_fit(console, org, api, ready_version):
    _devices(org, 2, ready_version, hardware="rpi4")
    fits = _preview(console, filter="hardware == rpi4", version=str(ready_version.pk)).json()
    assert fits["matching"] == 2 and fits["compatibility"]["fits"] is True
    grey = _converted(api, ready_version.model_id, "grey", channels=1)
    verdict = _preview(console, filter="hardware == rpi4", version=str(grey.pk)).json()["compatibility"]
    assert verdict["fits"] is False and verdict["affected"] == 2
    assert "input 'image': dim 1 is 1 in the package, 3 on the device" in verdict["message"]


def test_the_form_refuses_an_empty_target_unless_allowed(console, org, ready_version):
    _devices(org, 1, ready_version, hardware="jetson")
    refused = console.post("/releases/new/", _form(ready_version, allow_empty=""))
    text = refused.content.decode()
    assert refused.status_code == 200 and "0 matching devices" in text and "hardware == rpi4" in text
    assert not Release.objects.exists()
    created = console.post("/releases/new/", _form(ready_version, allow_empty="on"), follow=True)
    assert created.status_code == 200 and Release.objects.get().matching_devices == 0


def test_the_form_refuses_an_incompatible_version_unless_it_ships_a_new_pipeline(
    console, org, api, ready_version
):
    _devices(org, 2, ready_version, hardware="rpi4")
    grey = _converted(api, ready_version.model_id, "grey", channels=1)
    refused = console.post("/releases/new/", _form(grey))
    assert "does not fit what 2 of the targeted devices run now" in refused.content.decode()
    assert not Release.objects.exists()
    console.post("/releases/new/", _form(grey, new_pipeline="on"), follow=True)
    assert Release.objects.get().version == grey


def test_the_page_loads_the_preview_script_and_has_no_inline_script(console, ready_version):
    text = console.get("/releases/new/").content.decode()
    assert re.findall(r"<script[^>]*>", text) == [
        '<script src="/static/console/htmx.min.js" defer>',
        '<script src="/static/console/confirm.js" defer>',
        '<script src="/static/console/release_preview.js" defer>',
    ]
    assert 'data-preview-url="/releases/new/preview/"' in text
    script = console.get("/static/console/release_preview.js")
    assert script.status_code == 200


@pytest.mark.browser
def test_the_preview_updates_while_typing_in_a_browser(
    transactional_db, org, admin, ready_version, live_server, page
):
    _devices(org, 2, ready_version, hardware="rpi4")
    _login(page, live_server)
    page.goto(f"{live_server.url}/releases/new/")
    expect(page.locator("#preview-matching")).to_contain_text("Matching devices: 2.")
    expect(page.locator("#preview-compatibility")).to_contain_text("Compatible")
    page.get_by_label("Name").fill("preview")
    page.get_by_label("Filter").fill("hardware == rpi9")
    expect(page.locator("#preview-matching")).to_contain_text("matches 0 devices")
    create = page.get_by_role("button", name="Create release")
    expect(create).to_be_disabled()
    page.get_by_label("Allow empty").check()
    expect(create).to_be_enabled()
    page.get_by_label("Filter").fill("hardware == rpi4")
    expect(page.locator("#preview-matching")).to_contain_text("Matching devices: 2.")
    page.get_by_label("Allow empty").uncheck()
    expect(create).to_be_enabled()
    create.click()
    expect(page.locator("#release-state")).to_contain_text("Active")
    assert Release.objects.get().matching_devices == 2
