# The console shows what the platform tests build: share their fixtures.
import pytest
from playwright.sync_api import sync_playwright

from tests.console.browser import Offline, open_page
from tests.platform.conftest import admin, api, operator, org, outsider, ready_version, viewer  # noqa: F401


@pytest.fixture
def offline():
    return Offline()


@pytest.fixture
def offline_page(monkeypatch, offline):
    """A 1280x800 Chromium page that may load nothing but the live server; the test fails if a
    page it opened asked for anything else or broke the Content-Security-Policy."""
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code, so Django's guard is lifted.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser, page = open_page(p, offline)
        # the console asks before it changes a release (static/console/confirm.js): say yes,
        # and keep what was asked so a test can check it
        page.on("dialog", lambda dialog: (offline.dialogs.append(dialog.message), dialog.accept()))
        yield page
        browser.close()
    assert not offline.outside, f"requests off this machine: {offline.outside}"
    assert not offline.csp_violations, f"Content-Security-Policy violations: {offline.csp_violations}"
