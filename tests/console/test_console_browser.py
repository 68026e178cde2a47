"""The web console in a real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect
from releases.services import release_create

pytestmark = [pytest.mark.browser]


@pytest.fixture
def page(offline_page):
    """Every console browser test runs offline (tests/console/conftest.py: offline_page)."""
    return offline_page


@pytest.fixture
def console_data(transactional_db, org, admin, ready_version):
    release = release_create(
        organisation=org,
        version=ready_version,
        name="to the lab",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )
    return release


def _login(page, live_server, password="correct horse"):
    page.goto(f"{live_server.url}/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def test_wrong_password_is_refused(console_data, live_server, page):
    _login(page, live_server, password="wrong")
    expect(page.get_by_role("alert")).to_contain_text("did not match")


def test_release_manager_sees_fleet_and_pauses_a_release(console_data, live_server, page):
    _login(page, live_server)
    expect(page.get_by_role("heading", name="Acme")).to_be_visible()
    models = page.locator("#models")
    expect(models).to_contain_text("classifier")
    expect(models).to_contain_text("Ready")
    row = page.locator(f"tr[data-release='{console_data.pk}']")
    expect(row).to_contain_text("Active")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".messages")).to_contain_text("pause done")
    expect(page.locator(f"tr[data-release='{console_data.pk}']")).to_contain_text("Paused")
    console_data.refresh_from_db()
    assert console_data.state == "paused"
    assert console_data.events.last().actor.username == "alice"
