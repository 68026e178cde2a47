"""When the session ends while a console page polls (htmx, every 2 s), the whole page goes to the
login page, with ``next`` naming the page; the login form is never swapped into a fragment."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from playwright.sync_api import expect
from releases.services import release_create

from tests.console.browser import login, screenshot

POLL_MS = 10_000  # a 2 s poll, on a busy two-core machine


def _release(org, admin, version):
    return release_create(
        organisation=org,
        version=version,
        name="to the lab",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )


def _is_the_login_page(page, next_path: str) -> None:
    wanted = re.compile(r"/login/\?next=" + re.escape(quote(next_path, safe="/")) + "$")
    expect(page).to_have_url(wanted, timeout=POLL_MS)
    expect(page.get_by_role("heading", name="Log in")).to_have_count(1, timeout=POLL_MS)
    expect(page.locator("form")).to_have_count(1)  # one login form: the page's, not one per fragment
    assert page.locator("#dashboard-live, #release-live, #device-live").count() == 0


@pytest.mark.browser
def test_a_poll_after_the_cookie_is_gone_takes_the_whole_page_to_login(
    transactional_db, org, admin, ready_version, live_server, offline_page
):
    page = offline_page
    login(page, live_server)
    expect(page.locator("#dashboard-live")).to_be_visible()
    page.context.clear_cookies()  # the session cookie gone, as after the browser dropped it
    _is_the_login_page(page, "/")
    screenshot(page, "session-ended-dashboard")

    login_again = page.get_by_role("button", name="Log in")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("correct horse")
    login_again.click()
    expect(page.locator("#dashboard-live")).to_be_visible()  # next= brought the person back


@pytest.mark.browser
def test_a_poll_after_the_session_ended_on_the_server_takes_the_release_page_to_login(
    transactional_db, org, admin, ready_version, live_server, offline_page
):
    release = _release(org, admin, ready_version)
    page = offline_page
    login(page, live_server)
    page.goto(f"{live_server.url}/releases/{release.pk}/?state=refused")
    expect(page.locator("#release-state")).to_contain_text("Active")
    Session.objects.all().delete()  # logged out elsewhere, or expired: the cookie names nothing now
    _is_the_login_page(page, f"/releases/{release.pk}/?state=refused")


@pytest.mark.django_db
def test_a_signed_out_htmx_request_gets_401_and_where_to_go_and_a_page_request_a_redirect(org):
    client = Client()
    page = client.get("/live/dashboard/")
    assert page.status_code == 302 and page["Location"] == "/login/?next=/live/dashboard/"
    polled = client.get(
        "/live/dashboard/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/devices/?q=cam"
    )
    assert polled.status_code == 401 and b"<form" not in polled.content
    assert polled["HX-Redirect"] == "/login/?next=/devices/%3Fq%3Dcam"
    elsewhere = client.get(
        "/live/dashboard/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="https://evil.example/phish"
    )
    assert elsewhere.status_code == 401 and elsewhere["HX-Redirect"] == "/login/?next=/"
