"""Lists: cursor pages with a next link, declared filters, orderings, and a 400 naming any
query parameter a list does not take (never ignored)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fleet.models import Device
from fleet.services import device_enrol, device_group_create, device_record_check_in, enrolment_token_create
from telemetry.services import IncomingRecord, telemetry_ingest


def _enrol(org, name: str, labels: dict, version=None):
    token = enrolment_token_create(organisation=org, labels=labels).token
    device = device_enrol(token=token, name=name, attributes={"hw": "pi"}, labels=labels).device
    if version is not None:
        device = device_record_check_in(
            device=device, attributes={"hw": "pi"}, running_version_id=str(version.pk)
        )
    return device


def _walk(api, url: str) -> tuple[list[dict], int]:
    """Every row of a list, following next links; and how many pages that took."""
    rows, pages = [], 0
    while url:
        response = api.get(url)
        assert response.status_code == 200, response.content[:300]
        body = response.json()
        assert set(body) == {"next", "previous", "results"}
        rows += body["results"]
        pages += 1
        url = body["next"]
    return rows, pages


def _bad(response, *params: str) -> dict:
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert set(error["fields"]) == set(params), error
    return error


@pytest.mark.django_db
def test_an_automation_script_pages_and_filters_the_fleet(api, org, ready_version):
    lab = [_enrol(org, f"lab-{i}", {"site": "lab"}, ready_version) for i in range(5)]
    field = [_enrol(org, f"field-{i}", {"site": "field"}) for i in range(2)]
    group = device_group_create(
        organisation=org, name="two", kind="static", device_ids=[str(d.pk) for d in lab[:2]]
    )

    rows, pages = _walk(api, "/api/v1/devices/?limit=2&ordering=name")
    assert pages == 4
    assert [r["name"] for r in rows] == sorted(d.name for d in lab + field)  # each once, in order

    rows, _ = _walk(api, "/api/v1/devices/?filter=site%20%3D%3D%20lab&limit=3")  # filters survive paging
    assert {r["id"] for r in rows} == {str(d.pk) for d in lab}
    rows, _ = _walk(api, f"/api/v1/devices/?group={group.pk}")
    assert {r["id"] for r in rows} == {str(d.pk) for d in lab[:2]}
    rows, _ = _walk(api, f"/api/v1/devices/?version={ready_version.pk}&ordering=-name")
    assert [r["name"] for r in rows] == sorted((d.name for d in lab), reverse=True)
    Device.objects.filter(pk__in=[d.pk for d in field]).update(last_seen_at=datetime(2020, 1, 1, tzinfo=UTC))
    rows, _ = _walk(api, "/api/v1/devices/?last_seen_after=2021-01-01T00:00:00Z")
    assert {r["id"] for r in rows} == {str(d.pk) for d in lab}
    rows, _ = _walk(api, "/api/v1/devices/?last_seen_before=2021-01-01T00:00:00Z")
    assert {r["id"] for r in rows} == {str(d.pk) for d in field}
    rows, _ = _walk(api, "/api/v1/devices/?revoked=true")
    assert rows == []

    # what a list does not take is refused, naming the parameter
    _bad(api.get("/api/v1/devices/?search=lab"), "search")
    _bad(api.get("/api/v1/devices/?page=2&limit=-1"), "page", "limit")
    _bad(api.get("/api/v1/devices/?limit=abc"), "limit")
    _bad(api.get("/api/v1/devices/?limit=100000"), "limit")
    _bad(api.get("/api/v1/devices/?ordering=credential_sha256"), "ordering")
    _bad(api.get("/api/v1/devices/?cursor=garbage"), "cursor")
    _bad(api.get("/api/v1/devices/?group=a&group=b"), "group")
    _bad(api.get("/api/v1/devices/?group=00000000-0000-0000-0000-000000000000"), "group")
    assert _bad(api.get("/api/v1/devices/?filter=site%20%3D%3D"), "filter")["code"] == "invalid_filter"
    _bad(api.get("/api/v1/devices/?last_seen_after=yesterday"), "last_seen_after")


@pytest.mark.django_db
def test_releases_filter_by_state_and_version(api, org, ready_version):
    device = _enrol(org, "d", {"site": "lab"})
    ids = {}
    for name, start in (("draft", False), ("live", True), ("stopped", True)):
        body = {"name": name, "version": str(ready_version.pk), "target": {"device_ids": [str(device.pk)]}}
        ids[name] = api.post("/api/v1/releases/", {**body, "start": start}, format="json").json()["id"]
    assert api.post(f"/api/v1/releases/{ids['stopped']}/abort/", {}, format="json").status_code == 200

    rows, _ = _walk(api, "/api/v1/releases/?state=active")
    assert [r["id"] for r in rows] == [ids["live"]]
    rows, _ = _walk(api, "/api/v1/releases/?state=draft&state=aborted&ordering=name")
    assert [r["name"] for r in rows] == ["draft", "stopped"]
    rows, _ = _walk(api, f"/api/v1/releases/?version={ready_version.pk}&limit=1")
    assert len(rows) == 3
    rows, _ = _walk(api, "/api/v1/releases/?version=00000000-0000-0000-0000-000000000000")
    assert rows == []
    _bad(api.get("/api/v1/releases/?state=running"), "state")
    _bad(api.get("/api/v1/releases/?status=active"), "status")


@pytest.mark.django_db
def test_models_and_groups_are_paged_too(api, org):
    for name in ("c", "a", "b"):
        assert api.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
        device_group_create(organisation=org, name=f"g-{name}", kind="dynamic", filter_text="hw == pi")
    rows, pages = _walk(api, "/api/v1/models/?ordering=name&limit=2")
    assert ([r["name"] for r in rows], pages) == (["a", "b", "c"], 2)
    rows, _ = _walk(api, "/api/v1/device-groups/?ordering=-name&limit=1")
    assert [r["name"] for r in rows] == ["g-c", "g-b", "g-a"]
    _bad(api.get("/api/v1/models/?name=a"), "name")


@pytest.mark.django_db
def test_a_devices_telemetry_is_paged_newest_first_and_filtered(api, org):
    device = _enrol(org, "cam", {"site": "lab"})
    base = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    payload = {"inferences": 1, "errors": 0, "latency_ms_p50": 1.0, "latency_ms_p95": 2.0}
    records = [IncomingRecord(seq, "metrics", base + seq * 60, "", payload) for seq in range(1, 6)]
    telemetry_ingest(device=device, records=records)

    rows, pages = _walk(api, f"/api/v1/devices/{device.pk}/telemetry/?limit=2&ordering=received_at")
    assert ([r["seq"] for r in rows], pages) == ([1, 2, 3, 4, 5], 3)
    rows, _ = _walk(api, f"/api/v1/devices/{device.pk}/telemetry/?after=2026-01-01T00:03:00Z&kind=metrics")
    assert sorted(r["seq"] for r in rows) == [3, 4, 5]
    assert _walk(api, f"/api/v1/devices/{device.pk}/telemetry/?kind=activation")[0] == []
    _bad(api.get(f"/api/v1/devices/{device.pk}/telemetry/?since=1"), "since")
    assert api.get("/api/v1/devices/00000000-0000-0000-0000-000000000000/telemetry/").status_code == 404
