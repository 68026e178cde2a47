"""Models, a model's versions and a version's conversion report, in a real browser."""

from __future__ import annotations

import pytest
from django.test import Client
from playwright.sync_api import expect
from registry.models import Model
from releases.services import release_create

from tests.console.browser import login, screenshot

pytestmark = [pytest.mark.browser]


@pytest.fixture
def shipped(transactional_db, org, admin, ready_version):
    for n in range(30):  # more than a page of models
        Model.objects.create(organisation=org, name=f"detector-{n:02d}", description="finds things")
    return release_create(
        organisation=org,
        version=ready_version,
        name="to the lab",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )


def test_a_release_manager_finds_a_model_and_reads_its_conversion_report(
    shipped, ready_version, live_server, offline_page
):
    page = offline_page
    login(page, live_server)
    page.get_by_role("navigation").get_by_role("link", name="Models").click()
    expect(page.get_by_role("heading", name="Models")).to_be_visible()
    expect(page.locator(".pager")).to_contain_text("Page 1 of 2 · 31 models")
    screenshot(page, "models")
    page.get_by_role("link", name="Next").click()
    expect(page.locator(".pager")).to_contain_text("Page 2 of 2")

    page.get_by_label("Search").fill("classif")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#models tbody tr")).to_have_count(1)
    page.get_by_role("link", name="classifier").click()

    row = page.locator(f"tr[data-version='{ready_version.pk}']")
    expect(row).to_contain_text("v1")
    expect(row).to_contain_text("Ready")
    expect(row).to_contain_text("package")
    expect(row.get_by_role("link", name="to the lab")).to_be_visible()
    screenshot(page, "model")

    row.get_by_role("link", name="v1").click()
    ready_version.refresh_from_db()
    report = ready_version.report
    expect(page.locator("#package")).to_contain_text(ready_version.package.sha256)
    signature = page.locator("#signature")
    for spec in report["inputs"] + report["outputs"]:
        expect(signature).to_contain_text(spec["name"])
        expect(signature).to_contain_text(spec["dtype"])
    expect(page.locator("#report")).to_contain_text(f"{report['nodes_before']} in the ONNX model")
    expect(page.locator("#sizes")).to_contain_text("float32")
    expect(page.locator("#accuracy")).to_be_visible()
    expect(page.locator("#self-test")).to_contain_text("self-test vectors")
    expect(page.locator("#job-log li").first).to_be_visible()
    expect(page.locator("#releases")).to_contain_text("to the lab")
    screenshot(page, "version")
    page.get_by_role("link", name="Release this version").click()
    expect(page).to_have_url(f"{live_server.url}/releases/new/?version={ready_version.pk}")


def test_a_model_name_is_shown_as_text_never_run(transactional_db, org, admin):
    hostile = '<script>alert("x")</script>'
    Model.objects.create(organisation=org, name=hostile, description="<b>bold</b>")
    client = Client()
    client.force_login(admin[0])
    html = client.get("/models/", {"q": "<script>"}).content.decode()
    assert hostile not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html
    model = Model.objects.get(name=hostile)
    assert hostile not in client.get(f"/models/{model.pk}/").content.decode()


def test_an_unknown_model_or_version_is_a_404_page(transactional_db, org, admin):
    client = Client()
    client.force_login(admin[0])
    assert client.get("/models/999999/").status_code == 404
    assert client.get("/versions/not-a-uuid/").status_code == 404
    assert client.get("/versions/00000000-0000-0000-0000-000000000000/").status_code == 404
