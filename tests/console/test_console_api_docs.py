"""The API docs page works with nothing but the server: Swagger UI comes from vendored files."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.console.browser import login, screenshot

pytestmark = [pytest.mark.browser]
# both render the whole schema in the page: on a loaded 2-core host that has taken over 30 s
RENDER_MS = 90_000


def test_swagger_ui_renders_the_schema_without_the_internet(
    transactional_db, live_server, offline_page, offline
):
    offline_page.goto(f"{live_server.url}/api/docs/")
    title = offline_page.locator(".swagger-ui .info .title")
    expect(title).to_contain_text("Ferry control plane API", timeout=RENDER_MS)
    expect(offline_page.locator(".opblock-tag-section").first).to_be_visible()
    screenshot(offline_page, "api-docs")
    assert any("/static/drf_spectacular_sidecar/" in url for url in offline.loaded), offline.loaded
    assert not offline.outside


def test_every_page_carries_a_policy_that_refuses_inline_script(client, db):
    for url in ("/login/", "/api/docs/"):
        policy = client.get(url).headers["Content-Security-Policy"]
        scripts = policy.split("script-src")[1].split(";")[0]
        assert scripts.strip() == "'self'", policy


def test_redoc_renders_the_schema_without_the_internet(
    transactional_db, admin, live_server, offline_page, offline
):
    login(offline_page, live_server)
    offline_page.get_by_role("navigation").get_by_role("link", name="Redoc").click()
    expect(offline_page.locator("h1").first).to_contain_text("Ferry control plane API", timeout=RENDER_MS)
    expect(offline_page.get_by_text("API docs by Redocly")).to_be_visible()
    offline_page.wait_for_load_state("networkidle")
    screenshot(offline_page, "api-redoc")
    assert any(url.endswith("/redoc/redoc.standalone.js") for url in offline.loaded), offline.loaded
    assert not offline.outside and not offline.csp_violations
