"""The resources an automation script needs besides the rollout itself: device detail and labels,
version lists and deletion, enrolment tokens, a release's events and the audit feed."""

from __future__ import annotations

import pytest
from fleet.services import EnrolmentRefused, device_enrol, device_record_check_in, enrolment_token_create
from registry.models import ModelVersion

from tests.platform.conftest import onnx_bytes, upload


def _device(org, version=None):
    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    device = device_enrol(token=token, name="cam-1", attributes={"hw": "pi"}, labels={}).device
    if version is not None:
        device_record_check_in(device=device, attributes={"hw": "pi"}, running_version_id=str(version.pk))
    return device


@pytest.mark.django_db
def test_device_detail_shows_the_running_version_and_history_and_labels_are_edited(api, org, ready_version):
    device = _device(org, ready_version)
    detail = api.get(f"/api/v1/devices/{device.pk}/")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    ref = {"id": str(ready_version.pk), "model": "classifier", "label": "v1"}
    assert (body["running_version"], body["running_version_info"]) == (str(ready_version.pk), ref)
    assert (body["pinned_version"], body["pinned_version_info"]) == (None, None)
    assert [(h["from_version"], h["to_version_info"]) for h in body["history"]] == [(None, ref)]

    edited = api.patch(
        f"/api/v1/devices/{device.pk}/", {"labels": {"site": "field", "row": "3"}}, format="json"
    )
    assert edited.status_code == 200, edited.content
    assert edited.json()["labels"] == {"site": "field", "row": "3"}
    listed = api.get("/api/v1/devices/?filter=labels.site%20%3D%3D%20field").json()["results"]
    assert [d["id"] for d in listed] == [str(device.pk)]

    bad = api.patch(f"/api/v1/devices/{device.pk}/", {"labels": {"bad key!": "x"}}, format="json")
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"labels"}
    typo = api.patch(f"/api/v1/devices/{device.pk}/", {"lables": {}}, format="json")
    assert typo.status_code == 400
    assert api.get(f"/api/v1/devices/{device.pk}/").json()["labels"] == {"site": "field", "row": "3"}
    assert api.get("/api/v1/devices/00000000-0000-0000-0000-000000000000/").status_code == 404


@pytest.mark.django_db
def test_versions_are_listed_and_an_unreleased_one_deleted(api, org, ready_version):
    model_id = ready_version.model_id
    second = upload(api, model_id, "v2", onnx_bytes()).json()
    other = api.post("/api/v1/models/", {"name": "other"}, format="json").json()
    upload(api, other["id"], "o1", onnx_bytes())

    everything = api.get("/api/v1/versions/").json()["results"]
    assert [v["label"] for v in everything] == ["o1", "v2", "v1"]  # newest first
    per_model = api.get(f"/api/v1/models/{model_id}/versions/").json()["results"]
    assert [v["label"] for v in per_model] == ["v2", "v1"]
    assert [
        v["label"] for v in api.get(f"/api/v1/versions/?model={model_id}&status=ready").json()["results"]
    ] == ["v1"]
    assert api.get("/api/v1/models/424242/versions/").status_code == 404
    assert api.get(f"/api/v1/models/{model_id}/versions/?model=1").status_code == 400

    # a converting version cannot go yet; a ready one never released can
    refused = api.delete(f"/api/v1/versions/{second['id']}/")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "version_in_use")
    ModelVersion.objects.filter(pk=second["id"]).update(status=ModelVersion.Status.FAILED)
    assert api.delete(f"/api/v1/versions/{second['id']}/").status_code == 204
    assert api.get(f"/api/v1/versions/{second['id']}/").status_code == 404

    # a version a release refers to stays
    release = {"name": "r", "version": str(ready_version.pk), "allow_empty": True}
    assert api.post("/api/v1/releases/", release, format="json").status_code == 201
    kept = api.delete(f"/api/v1/versions/{ready_version.pk}/")
    assert (kept.status_code, kept.json()["error"]["code"]) == (409, "version_in_use")
    assert api.get(f"/api/v1/versions/{ready_version.pk}/").status_code == 200


@pytest.mark.django_db
def test_enrolment_tokens_are_listed_and_revoked(api, org):
    created = api.post("/api/v1/enrolment-tokens/", {"labels": {"site": "lab"}}, format="json")
    assert created.status_code == 201
    token, token_id = created.json()["token"], created.json()["id"]
    used = api.post("/api/v1/enrolment-tokens/", {}, format="json").json()
    device_enrol(token=used["token"], name="d", attributes={}, labels={})

    listed = api.get("/api/v1/enrolment-tokens/").json()["results"]
    assert [(t["id"], t["state"]) for t in listed] == [(used["id"], "used"), (token_id, "unused")]
    assert all("token" not in t for t in listed)  # the secret is shown once, at creation

    revoked = api.post(f"/api/v1/enrolment-tokens/{token_id}/revoke/")
    assert (revoked.status_code, revoked.json()["state"]) == (200, "expired")
    assert api.post(f"/api/v1/enrolment-tokens/{token_id}/revoke/").status_code == 200  # again: no change
    with pytest.raises(EnrolmentRefused):
        device_enrol(token=token, name="late", attributes={}, labels={})
    spent = api.post(f"/api/v1/enrolment-tokens/{used['id']}/revoke/")
    assert (spent.status_code, spent.json()["error"]["code"]) == (409, "enrolment_token_used")
    assert api.post("/api/v1/enrolment-tokens/424242/revoke/").status_code == 404


@pytest.mark.django_db
def test_release_events_and_the_audit_feed(api, org, admin, ready_version):
    device = _device(org)
    body = {"name": "r", "version": str(ready_version.pk), "target": {"device_ids": [str(device.pk)]}}
    release = api.post("/api/v1/releases/", {**body, "start": True}, format="json").json()
    api.post(f"/api/v1/releases/{release['id']}/pause/", {"reason": "look"}, format="json")

    events = api.get(f"/api/v1/releases/{release['id']}/events/")  # was a 405: the action route took it
    assert events.status_code == 200, events.content
    rows = events.json()["results"]
    assert [e["action"] for e in rows][-1] == "pause" and rows[-1]["reason"] == "look"
    assert all(e["release"] == release["id"] and e["actor"] == "alice" for e in rows)

    feed = api.get("/api/v1/audit/?actor=alice").json()["results"]
    assert [e["id"] for e in feed] == [e["id"] for e in reversed(rows)]  # newest first
    assert api.get("/api/v1/audit/?actor=").json()["results"] == []  # the system did nothing yet
    assert api.get("/api/v1/audit/?after=2999-01-01T00:00:00Z").json()["results"] == []
    assert len(api.get(f"/api/v1/audit/?release={release['id']}&limit=1").json()["results"]) == 1
    assert api.get("/api/v1/audit/?object=x").status_code == 400
