"""PATCH /api/v1/releases/<id>/: a draft is edited with the create's checks; a started one is not."""

from __future__ import annotations

import pytest
from fleet.services import device_enrol, device_record_check_in, enrolment_token_create
from releases.models import Release


def _devices(org, version, sites=("lab", "field")):
    for i, site in enumerate(sites):
        token = enrolment_token_create(organisation=org, labels={"site": site}).token
        device = device_enrol(token=token, name=f"cam-{i}", attributes={"hw": "pi"}, labels={}).device
        device_record_check_in(device=device, attributes={"hw": "pi"}, running_version_id=str(version.pk))


def _draft(api, version) -> dict:
    body = {"name": "draft", "version": str(version.pk), "target": {"labels": {"site": "lab"}}}
    created = api.post("/api/v1/releases/", body, format="json")
    assert created.status_code == 201, created.content
    return created.json()


@pytest.mark.django_db
def test_a_draft_is_edited_audited_and_its_etag_moves(api, org, ready_version):
    _devices(org, ready_version)
    release = _draft(api, ready_version)
    url = f"/api/v1/releases/{release['id']}/"
    first = api.get(url)
    edited = api.patch(
        url,
        {
            "name": "to the field",
            "target": {"filter": "labels.site == field"},
            "phases": [{"percentage": 50}, {"percentage": 100, "manual_approval": True}],
            "priority": 7,
            "window": {"cron": "0 2 * * *", "duration_seconds": 3600},
        },
        format="json",
        HTTP_IF_MATCH=first["ETag"],
    )
    assert edited.status_code == 200, edited.content
    body = edited.json()
    assert (body["name"], body["priority"], body["state"]) == ("to the field", 7, "draft")
    assert body["target"] == {"filter": "labels.site == field"}
    assert [p["percentage"] for p in body["phases"]] == [50.0, 100.0]
    assert body["phases"][0]["min_soak_seconds"] == 0  # the create's defaults apply
    assert body["window"]["timezone"] == "UTC"
    assert body["revision"] == release["revision"] + 1
    assert body["devices"]["matching"] == 1
    assert edited["ETag"] != first["ETag"]
    events = api.get(f"{url}events/").json()["results"]
    assert [(e["type"], e["actor"]) for e in events][-1] == ("release.edited", "alice")
    assert "name" in events[-1]["details"]["changed"]

    stale = api.patch(url, {"priority": 1}, format="json", HTTP_IF_MATCH=first["ETag"])
    assert stale.status_code == 412 and stale.json()["error"]["code"] == "precondition_failed"
    behind = api.patch(url, {"priority": 1, "expected_revision": release["revision"]}, format="json")
    assert behind.status_code == 409
    assert Release.objects.get(pk=release["id"]).priority == 7


@pytest.mark.django_db
def test_an_edit_is_validated_as_a_create_would_be(api, org, ready_version):
    _devices(org, ready_version)
    url = f"/api/v1/releases/{_draft(api, ready_version)['id']}/"
    cases = {
        "priority": {"priority": 2**63},
        "phases": {"phases": [{"percentage": 101}]},
        "non_field_errors": {"start": True},  # an action, not an edit: unknown field
        "gate": {"gate": {"max_drift": 2}},
    }
    for field, patch in cases.items():
        answer = api.patch(url, patch, format="json")
        assert answer.status_code == 400, (patch, answer.content)
        assert field in answer.json()["error"].get("fields", {}), answer.json()
    empty = api.patch(url, {"target": {"labels": {"site": "nowhere"}}}, format="json")
    assert empty.status_code == 400 and "0 matching devices" in empty.json()["error"]["message"]
    allowed = api.patch(url, {"target": {"labels": {"site": "nowhere"}}, "allow_empty": True}, format="json")
    assert allowed.status_code == 200 and allowed.json()["devices"]["matching"] == 0
    both = api.patch(url, {"phases": [{"percentage": 10}], "target": {"percentage": 5}}, format="json")
    assert both.status_code == 400
    missing = api.patch(url, {"version": "00000000-0000-0000-0000-000000000000"}, format="json")
    assert missing.status_code in (400, 404)


@pytest.mark.django_db
def test_a_started_release_is_not_edited(api, org, ready_version):
    _devices(org, ready_version)
    release = _draft(api, ready_version)
    url = f"/api/v1/releases/{release['id']}/"
    assert api.post(f"{url}start/", {}, format="json").status_code == 200
    refused = api.patch(url, {"name": "too late"}, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "release_not_draft"
    assert Release.objects.get(pk=release["id"]).name == "draft"
