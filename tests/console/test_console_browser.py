"""The web console in a real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import expect, sync_playwright
from releases.services import release_create

pytestmark = [pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without these, Chromium tries to reach Google's services, which this network refuses.
QUIET_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page(monkeypatch):
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code, so Django's guard is lifted.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=QUIET_FLAGS)
        page = browser.new_page()
        yield page
        browser.close()


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
