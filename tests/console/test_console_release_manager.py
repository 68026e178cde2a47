"""A release manager's whole path in the console, in Debian's headless Chromium, against real
processes: the web server, the Celery worker and beat, the gRPC gateway and three real agents.

Upload a model in the console and watch it convert; release it to the fleet with a filter
(its match count previewed while typing); release a second version in phases and watch the
per-device status change on the open page as the agents install it (no reload); roll it
back; release a version signed for another device class and see the refusals with their
reason, and the gate's abort. Nothing loads from outside
(the offline_page fixture fails the test on any non-loopback request or CSP violation), and
every page is saved as a 1280x800 screenshot under FERRY_ARTIFACTS_DIR.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ferry_cloud.stack import RestClient, Stack, free_port
from playwright.sync_api import expect

from converter.samples import build_image_classifier
from tests.console.browser import screenshot
from tests.e2e.fleet_stack import release_environment, running, start_agents
from tests.e2e.helpers import bootstrap_admin, wait_until

LABELS = {"fleet": "console"}
CHECKIN_SECONDS = 2
CONVERSION_MS = 180_000  # a conversion on a busy two-core machine
AGENTS_MS = 120_000

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.browser]


@pytest.fixture
def environment(tmp_path: Path):
    # the gate every second: phases advance and the refusals abort while the page is open
    with release_environment(tmp_path, "ferry_console_e2e", checkin_seconds=CHECKIN_SECONDS) as environment:
        yield environment


def _upload(page, label: str, onnx_file: Path, device_class: str = "") -> None:
    """On a model's page: upload a version, then watch its conversion until the report shows."""
    page.get_by_label("Label").fill(label)
    page.get_by_label("ONNX file").set_input_files(str(onnx_file))
    page.get_by_label("Device class").fill(device_class)
    page.get_by_role("button", name="Upload and convert").click()
    expect(page.locator(".messages")).to_contain_text(f"{label} uploaded: converting")
    expect(page.locator("#job-status")).to_be_visible()
    # the job's status and log lines arrive every 2 s; when it ends the page reloads itself once
    expect(page.locator("#package")).to_contain_text("Digest (sha256)", timeout=CONVERSION_MS)
    expect(page.locator("#job-status")).to_contain_text("Succeeded")
    expect(page.locator("#job-log li").first).to_be_visible()


def _new_release(page, name: str, phases: str) -> None:
    """From a version's page: a release to the agents' fleet, chosen by a filter."""
    page.get_by_role("link", name="Release this version").click()
    page.get_by_label("Name").fill(name)
    page.get_by_label("Filter").fill("labels.fleet == nowhere")
    expect(page.locator("#preview-matching")).to_contain_text("matches 0 devices")
    page.get_by_label("Filter").fill("labels.fleet == console")
    expect(page.locator("#preview-matching")).to_contain_text("Matching devices: 3.")
    page.get_by_label("Phases").fill(phases)
    page.get_by_label("Min soak seconds").fill("0")
    page.get_by_label("Min reporting devices").fill("1")
    screenshot(page, f"e2e-release-new-{name}")
    page.get_by_role("button", name="Create release").click()
    expect(page.locator("#release-state")).to_contain_text("Active")


def _states_seen(page, seen: dict[str, set[str]]) -> None:
    """Record the state each device row shows now (the page is never reloaded meanwhile)."""
    for row in page.locator("#device-status tbody tr").all():
        try:
            name, state = row.locator("td").nth(0).inner_text(), row.locator("td").nth(1).inner_text()
        except Exception:  # the row was swapped out under us by the next poll: read it next time
            continue
        seen.setdefault(name, set()).add(state.strip())


def test_a_release_manager_uploads_releases_watches_refusals_and_rolls_back(
    environment, tmp_path: Path, offline_page, offline
):
    env = {**os.environ, **environment}
    token = bootstrap_admin(env, "Console E2E", password="pw")
    stack = Stack(log_dir=tmp_path / "logs", env=environment)
    http_port, gateway_port = free_port(), free_port()
    onnx_file = tmp_path / "classifier.onnx"
    onnx_file.write_bytes(build_image_classifier().SerializeToString())
    page = offline_page
    base = f"http://127.0.0.1:{http_port}"
    try:
        stack.start_control_plane(http_port, gateway_port)
        api = RestClient(base, token)

        page.goto(f"{base}/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill("pw")
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="Console E2E")).to_be_visible()
        screenshot(page, "e2e-dashboard-empty")

        # a model and its first version, uploaded and converted in the console
        page.get_by_role("navigation").get_by_role("link", name="Models").click()
        page.get_by_label("Name").fill("classifier")
        page.get_by_role("button", name="Create model").click()
        expect(page.get_by_role("heading", name="classifier")).to_be_visible()
        _upload(page, "v1", onnx_file)
        screenshot(page, "e2e-version-v1")
        # the agents enrol once the release key exists (the first conversion made it): agents
        # enrolling at once while the gateway makes it race on its temporary file
        start_agents(stack, api, gateway_port, tmp_path, LABELS)
        wait_until("three agents enrolled", lambda: len(running(api)) == 3, stack, 60)

        # v1 to the whole fleet (one phase): every agent installs it
        _new_release(page, "v1", "100")
        wait_until("three agents on v1", lambda: list(running(api).values()) == ["v1"] * 3, stack, 120)
        expect(page.locator("#device-status")).not_to_contain_text("pending", timeout=AGENTS_MS)

        # v2 in two phases: watch the agents' rows change on the open page, then roll it back
        page.goto(f"{base}/models/")
        page.get_by_role("link", name="classifier").click()
        _upload(page, "v2", onnx_file)
        _new_release(page, "v2", "50, 100")
        page.evaluate("window.ferryNoReload = 'still here'")  # a reload would lose it
        seen: dict[str, set[str]] = {}
        deadline = time.monotonic() + AGENTS_MS / 1000
        while time.monotonic() < deadline and list(running(api).values()) != ["v2"] * 3:
            stack.check_alive()
            _states_seen(page, seen)
            time.sleep(0.5)
        expect(page.locator("#device-status")).not_to_contain_text("pending", timeout=AGENTS_MS)
        _states_seen(page, seen)
        assert page.evaluate("window.ferryNoReload") == "still here", "the page reloaded"
        print(f"per-device states seen on the open page: {seen}")
        assert {"pending", "running"} <= set().union(*seen.values()), seen
        assert any(len(states) > 1 for states in seen.values()), f"no row changed on the page: {seen}"
        screenshot(page, "e2e-release-v2-installed")
        page.get_by_label("Reason for the next action").fill("back to v1 for the demo")
        page.get_by_role("button", name="Rollback").click()
        expect(page.locator("#release-state")).to_contain_text("Rolled back")
        assert any("Roll back" in message for message in offline.dialogs), offline.dialogs
        expect(page.locator("#audit")).to_contain_text("back to v1 for the demo")
        wait_until("every agent on v1 again", lambda: list(running(api).values()) == ["v1"] * 3, stack, 120)
        screenshot(page, "e2e-release-v2-rolled-back")

        # v3, signed for jetsons only: the generic agents refuse it, with the reason, and the
        # gate aborts the release (a refusal is evidence enough), all seen without a reload
        page.goto(f"{base}/models/")
        page.get_by_role("link", name="classifier").click()
        _upload(page, "v3", onnx_file, device_class="jetson")
        _new_release(page, "v3", "100")
        page.evaluate("window.ferryNoReload = 'still here'")
        refused = page.locator("#device-status tr.device-state-refused")
        expect(refused.first).to_contain_text("wrong_device_class", timeout=AGENTS_MS)
        expect(refused.first).to_contain_text("jetson")
        expect(page.locator("#release-state")).to_contain_text("Aborted", timeout=AGENTS_MS)
        expect(page.locator("#gate")).to_contain_text("refused or failed the update")
        expect(page.locator("#audit")).to_contain_text("device_refused")
        assert page.evaluate("window.ferryNoReload") == "still here", "the page reloaded"
        screenshot(page, "e2e-release-v3-refused")
        page.get_by_role("navigation").get_by_role("link", name="Dashboard").click()
        expect(page.locator("#failures")).to_contain_text("wrong_device_class")
        screenshot(page, "e2e-dashboard")

        page.get_by_role("navigation").get_by_role("link", name="Devices").click()
        screenshot(page, "e2e-devices")
        page.get_by_role("link", name="agent-1").click()
        expect(page.locator("#device-releases")).to_contain_text("wrong_device_class")
        screenshot(page, "e2e-device")
    finally:
        codes = stack.stop()
    assert all(code in (0, -15) for name, code in codes.items() if name.startswith("agent")), codes
