"""Safe retries and concurrency: Idempotency-Key on creates, ETag and If-Match on changes,
Location on 201."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from ferry_cloud.idempotency import KEEP
from ferry_cloud.models import IdempotencyRecord
from registry.models import Model, ModelVersion
from releases.models import Release

from tests.platform.conftest import onnx_bytes


@pytest.mark.django_db
def test_a_retried_release_create_answers_the_first_response_and_makes_one_release(api, ready_version):
    body = {"name": "nightly", "version": str(ready_version.pk), "allow_empty": True}
    first = api.post("/api/v1/releases/", body, format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    assert first.status_code == 201, first.content
    assert first["Location"].endswith(f"/api/v1/releases/{first.json()['id']}/")
    again = api.post("/api/v1/releases/", body, format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    assert (again.status_code, again.json(), again["Location"]) == (201, first.json(), first["Location"])
    assert again["Idempotent-Replayed"] == "true"
    assert Release.objects.count() == 1

    other = api.post(
        "/api/v1/releases/", {**body, "name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="run-42"
    )
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_key_reused")
    assert Release.objects.count() == 1
    fresh = api.post(
        "/api/v1/releases/", {**body, "name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="run-43"
    )
    assert fresh.status_code == 201 and Release.objects.count() == 2
    assert api.post("/api/v1/releases/", body, format="json", HTTP_IDEMPOTENCY_KEY="a b").status_code == 400


@pytest.mark.django_db
def test_keys_are_kept_a_day_and_a_failed_create_does_not_hold_its_key(api, ready_version):
    refused = api.post("/api/v1/models/", {"name": "../bad"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert refused.status_code == 400
    assert (
        api.post("/api/v1/models/", {"name": "good"}, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code
        == 201
    )
    assert Model.objects.filter(name="good").count() == 1

    record = IdempotencyRecord.objects.get(key="k1")
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        created_at=record.created_at - KEEP + timedelta(minutes=1)
    )
    replay = api.post("/api/v1/models/", {"name": "good"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"

    # an upload is fingerprinted by its file: the same file replays, another is a reused key
    url, data = f"/api/v1/models/{ready_version.model_id}/versions/", onnx_bytes()

    def upload(content: bytes):
        body = {"file": io.BytesIO(content), "label": "v9"}
        return api.post(url, body, format="multipart", HTTP_IDEMPOTENCY_KEY="up-1")

    first = upload(data)
    assert first.status_code == 201 and first["Location"].endswith(f"/api/v1/versions/{first.json()['id']}/")
    assert upload(data).json()["id"] == first.json()["id"]
    reused = upload(data + b"x")
    assert (reused.status_code, reused.json()["error"]["code"]) == (409, "idempotency_key_reused")
    assert ModelVersion.objects.filter(label="v9").count() == 1


@pytest.mark.django_db
def test_an_enrolment_token_is_never_replayed(api):
    first = api.post("/api/v1/enrolment-tokens/", {}, format="json", HTTP_IDEMPOTENCY_KEY="tok")
    assert first.status_code == 201
    again = api.post("/api/v1/enrolment-tokens/", {}, format="json", HTTP_IDEMPOTENCY_KEY="tok")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "idempotent_secret_shown")
    assert first.json()["token"] not in again.content.decode()
    assert str(first.json()["id"]) in again.json()["error"]["message"]
    assert first.json()["token"] not in str(IdempotencyRecord.objects.get(key="tok").body)


@pytest.mark.django_db
def test_if_match_refuses_a_change_to_what_moved_since_it_was_read(api, org, ready_version):
    group = api.post("/api/v1/device-groups/", {"name": "g"}, format="json")
    assert group.status_code == 201 and group["Location"].endswith(
        f"/api/v1/device-groups/{group.json()['id']}/"
    )
    url = group["Location"]
    read = api.get(url)
    tag = read["ETag"]
    assert tag and api.get(url)["ETag"] == tag  # stable while nothing changes

    renamed = api.patch(url, {"name": "g2"}, format="json", HTTP_IF_MATCH=tag)
    assert renamed.status_code == 200 and renamed["ETag"] != tag
    stale = api.patch(url, {"name": "g3"}, format="json", HTTP_IF_MATCH=tag)
    assert (stale.status_code, stale.json()["error"]["code"]) == (412, "precondition_failed")
    assert api.get(url).json()["name"] == "g2"
    assert api.delete(url, HTTP_IF_MATCH=tag).status_code == 412
    assert api.delete(url, HTTP_IF_MATCH="*").status_code == 204

    # a release's tag is its revision: a script acting on an old read is refused
    body = {"name": "r", "version": str(ready_version.pk), "allow_empty": True}
    release = api.post("/api/v1/releases/", body, format="json")
    url = release["Location"]
    tag = api.get(url)["ETag"]
    assert api.post(url + "start/", {}, format="json", HTTP_IF_MATCH=tag).status_code == 200
    late = api.post(url + "pause/", {}, format="json", HTTP_IF_MATCH=tag)
    assert late.status_code == 412
    assert api.get(url).json()["state"] == "active"
    assert api.post(url + "pause/", {}, format="json", HTTP_IF_MATCH=api.get(url)["ETag"]).status_code == 200
