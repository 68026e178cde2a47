"""The console's live parts: what htmx re-fetches every 2 s, and the canary comparison charts.

The browser tests change rows while a page is open and watch the change arrive without a
reload (a marker set on the page's window survives); they print the delay they saw.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect
from registry.models import ConversionJob, ModelVersion
from releases.models import DeviceReleaseStatus
from releases.services import release_create
from telemetry.models import TelemetryRecord, TelemetryRollup

from tests.console.browser import login, screenshot
from tests.console.test_console_device_pages import fleet

LIVE_TIMEOUT_MS = 5_000  # the bound: a change on a device shows within 5 s


@pytest.fixture
def client_for(admin):
    def make(user=None) -> Client:
        client = Client()
        client.force_login(user or admin[0])
        return client

    return make


def _release(org, admin, version, **extra):
    return release_create(
        organisation=org,
        version=version,
        name="to the lab",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
        **extra,
    )


def test_the_release_live_part_is_a_fragment_with_pages_and_a_state_filter(
    db, org, admin, ready_version, client_for
):
    devices = fleet(org, 130)  # 65 on the lab site: more than one page of per-device status
    release = _release(org, admin, ready_version)
    refused = devices[1]
    DeviceReleaseStatus.objects.create(
        release=release,
        device=refused,
        state="refused",
        reason_code="wrong_device_class",
        message="signed for <jetson>",
    )
    client = client_for()
    live = client.get(f"/releases/{release.pk}/live/").content.decode()
    assert "<html" not in live and 'id="release-state"' in live
    assert live.count('class="device-state-') == 50 and "1–50 of 65" in live
    table = live.split('id="device-status"')[1]
    assert table.index("wrong_device_class") < table.index("pending")  # failures first
    assert "signed for &lt;jetson&gt;" in live and "signed for <jetson>" not in live
    second = client.get(f"/releases/{release.pk}/live/", {"page": 2}).content.decode()
    assert second.count('class="device-state-') == 15 and "51–65 of 65" in second
    only = client.get(f"/releases/{release.pk}/live/", {"state": "refused"}).content.decode()
    assert only.count('class="device-state-') == 1 and refused.name in only
    page = client.get(f"/releases/{release.pk}/", {"state": "refused"}).content.decode()
    assert f'hx-get="/releases/{release.pk}/live/?state=refused&amp;page=1"' in page
    assert 'hx-trigger="every 2s"' in page
    for junk in ({"state": "<script>"}, {"page": "-3"}, {"page": "x"}):
        assert client.get(f"/releases/{release.pk}/live/", junk).status_code == 200


def test_the_gate_shows_current_values_against_thresholds(db, org, admin, ready_version, client_for):
    release = _release(org, admin, ready_version, gate={"max_error_rate": 0.01, "max_drift": None})
    release.gate_status = {
        "step": "pause",
        "reason": "inference error rate 0.05 > 0.01",
        "failures": ["inference error rate 0.05 > 0.01"],
        "figures": {"error_rate": 0.05, "latency_p95_ratio": 1.1, "devices_reporting": 3},
    }
    release.save(update_fields=["gate_status"])
    live = client_for().get(f"/releases/{release.pk}/live/").content.decode()
    row = live.split("Inference error rate")[1].split("</tr>")[0]
    assert "0.05" in row and "≤ 0.01" in row and 'class="over"' in row
    latency = live.split("p95 latency ratio")[1].split("</tr>")[0]
    assert "1.1" in latency and "≤ 1.5" in latency and "ok" in latency
    assert "Output drift</td><td>–</td><td>off" in live


def _rollups(org, version_id: str, hours: int, devices: int, **figures) -> list[TelemetryRollup]:
    top = timezone.now().replace(minute=0, second=0, microsecond=0)
    return [
        TelemetryRollup(
            organisation=org,
            version_id=version_id,
            hour=top - timedelta(hours=h),
            records=devices * 60,
            metrics_records=devices * 60,
            devices=devices,
            **figures,
        )
        for h in range(1, hours)
    ]


def test_the_canary_json_compares_the_release_with_the_rest_of_the_fleet(
    db, org, admin, ready_version, client_for
):
    release = _release(org, admin, ready_version)
    mine, other = str(ready_version.pk), "11111111-1111-1111-1111-111111111111"
    TelemetryRollup.objects.bulk_create(
        _rollups(org, mine, 6, 10, inferences=1000, errors=20, latency_ms_p95_median=12.0)
        + _rollups(org, other, 6, 90, inferences=9000, errors=9, latency_ms_p95_median=8.0)
    )
    device = fleet(org, 1)[0]
    now = timezone.now()
    payloads = [
        {"inferences": 100, "errors": 5, "latency_ms_p95": 20.0},
        {"inferences": 100, "errors": 0, "latency_ms_p95": 30.0},
        {"inferences": "lots", "errors": None, "latency_ms_p95": "slow"},  # not numbers: absent
    ]
    for seq, payload in enumerate(payloads, start=1):
        TelemetryRecord.objects.create(
            device=device, seq=seq, kind="metrics", timestamp=now, version_id=mine, payload=payload
        )
    data = client_for().get(f"/releases/{release.pk}/canary/").json()
    assert len(data["hours"]) == 24 and data["bucket_seconds"] == 3600
    ours, rest = data["release_devices"], data["rest_of_fleet"]
    assert ours["error_rate"][-6:-1] == [0.02] * 5 and rest["error_rate"][-6:-1] == [0.001] * 5
    assert ours["latency_ms_p95"][-2] == 12.0 and rest["latency_ms_p95"][-2] == 8.0
    assert ours["devices"][-2] == 10 and rest["devices"][-2] == 90
    # the current hour is still raw records: summed in SQL, the non-numbers left out
    assert ours["inferences"][-1] == 200 and ours["errors"][-1] == 5
    assert ours["latency_ms_p95"][-1] == 25.0 and rest["inferences"][-1] == 0
    assert data["sources"] == {"rollup_rows": 10, "raw_groups": 1}
    assert ours["error_rate"][0] is None  # no data that hour
    chart = client_for().get(f"/releases/{release.pk}/canary/chart/").content.decode()
    assert chart.count('<polyline class="release"') == 2 and chart.count('<polyline class="fleet"') == 2
    assert client_for().get(f"/releases/{release.pk}/canary/", {"hours": "x"}).status_code == 400


def test_a_day_of_charts_over_100000_devices_reads_buckets_not_devices(
    db, org, admin, ready_version, client_for
):
    """The figures of 100,000 devices over a day are 24 hourly rollups per version: the chart's
    cost does not depend on how many devices they summarise."""
    release = _release(org, admin, ready_version)
    mine = str(ready_version.pk)
    others = [f"2222222{n}-2222-2222-2222-222222222222" for n in range(4)]

    def measure() -> tuple[int, float, dict]:
        client = client_for()
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(f"/releases/{release.pk}/canary/")
            took = time.perf_counter() - started
        assert response.status_code == 200
        return len(queries), took, response.json()

    TelemetryRollup.objects.bulk_create(_rollups(org, mine, 25, 10, inferences=10, errors=0))
    small_queries, _, _ = measure()
    TelemetryRollup.objects.all().delete()
    rows = _rollups(org, mine, 24, 5_000, inferences=300_000, errors=30, latency_ms_p95_median=9.0)
    for version in others:  # 95,000 devices on four other versions
        rows += _rollups(org, version, 24, 23_750, inferences=1_425_000, errors=14, latency_ms_p95_median=7.0)
    TelemetryRollup.objects.bulk_create(rows)
    queries, took, data = measure()
    devices = data["release_devices"]["devices"][-2] + data["rest_of_fleet"]["devices"][-2]
    print(f"canary JSON, 100,000 devices over a day: {queries} queries, {took * 1000:.0f} ms")
    assert devices == 100_000 and data["sources"]["rollup_rows"] == 23 * 5  # 23 full hours; the 24th is now
    assert queries == small_queries
    assert took < 1.0, took
    chart = client_for()
    started = time.perf_counter()
    assert chart.get(f"/releases/{release.pk}/canary/chart/").status_code == 200
    print(f"canary SVG charts, 100,000 devices over a day: {(time.perf_counter() - started) * 1000:.0f} ms")


def _marker(page) -> None:
    """Set on the window: a reload would lose it, so its survival proves there was none."""
    page.evaluate("window.ferryNoReload = 'still here'")


def _no_reload(page) -> bool:
    return page.evaluate("window.ferryNoReload") == "still here"


@pytest.mark.browser
def test_a_device_refusal_shows_on_the_open_release_page_within_5_seconds(
    transactional_db, org, admin, ready_version, live_server, offline_page
):
    devices = fleet(org, 6)
    release = _release(org, admin, ready_version)
    page = offline_page
    login(page, live_server)
    page.goto(f"{live_server.url}/releases/{release.pk}/")
    expect(page.locator("#release-state")).to_contain_text("Active")
    _marker(page)
    started = time.monotonic()
    DeviceReleaseStatus.objects.create(
        release=release,
        device=devices[1],
        state="refused",
        reason_code="wrong_device_class",
        message="signed for jetson, this device is generic",
    )
    row = page.locator(f"#device-status tr[data-device='{devices[1].pk}']")
    expect(row).to_contain_text("refused", timeout=LIVE_TIMEOUT_MS)
    delay = time.monotonic() - started
    expect(row).to_contain_text("wrong_device_class")
    expect(page.locator("#by-state")).to_contain_text("refused 1")
    print(f"a device's refusal reached the open release page {delay:.2f} s after it was stored")
    assert _no_reload(page)
    screenshot(page, "release-live")

    page.goto(f"{live_server.url}/")
    _marker(page)
    expect(page.locator("#failures")).to_contain_text("wrong_device_class")
    DeviceReleaseStatus.objects.create(
        release=release, device=devices[3], state="failed", reason_code="self_test"
    )
    expect(page.locator("#failures")).to_contain_text("self_test", timeout=LIVE_TIMEOUT_MS)
    expect(page.locator(f"tr[data-release='{release.pk}']")).to_contain_text("2 refused or failed")
    assert _no_reload(page)
    screenshot(page, "dashboard")

    page.goto(f"{live_server.url}/devices/{devices[5].pk}/")
    _marker(page)
    devices[5].running_version = ready_version
    devices[5].save(update_fields=["running_version"])
    expect(page.locator("#device-live")).to_contain_text(str(ready_version), timeout=LIVE_TIMEOUT_MS)
    assert _no_reload(page)


@pytest.mark.browser
def test_a_conversion_shows_its_log_lines_live_then_its_report(
    transactional_db, org, admin, ready_version, live_server, offline_page
):
    report, package = ready_version.report, ready_version.package
    converting = ModelVersion.objects.create(
        model=ready_version.model, label="v2", source=ready_version.source, status="converting"
    )
    job = ConversionJob.objects.create(version=converting, status="running", progress=0.1)
    page = offline_page
    login(page, live_server)
    page.goto(f"{live_server.url}/models/{ready_version.model_id}/")
    expect(page.locator(f"tr[data-version='{converting.pk}']")).to_contain_text("Converting")
    page.get_by_role("link", name="v2").click()
    expect(page.locator("#job-status")).to_contain_text("Running")
    _marker(page)
    job.log = [{"message": "optimising the graph: 14 → 9 nodes"}]
    job.progress = 0.5
    job.save()
    expect(page.locator("#job-log")).to_contain_text("14 → 9 nodes", timeout=LIVE_TIMEOUT_MS)
    expect(page.locator("#job-status")).to_contain_text("50%")
    assert _no_reload(page)
    screenshot(page, "version-converting")
    ModelVersion.objects.filter(pk=converting.pk).update(status="ready", report=report, package=package)
    job.status, job.progress = "succeeded", 1.0
    job.save()
    # finished: the page reloads once by itself and shows the report, then stops asking
    expect(page.locator("#package")).to_contain_text(package.sha256, timeout=LIVE_TIMEOUT_MS)
    expect(page.locator("#job-status")).to_contain_text("Succeeded")
    assert not _no_reload(page)
    assert page.locator("#job[hx-trigger]").count() == 0
