"""Conversion jobs as resources, and a version's signed package for admins."""

from __future__ import annotations

import hashlib

import pytest
from rest_framework.test import APIClient

from tests.platform.conftest import onnx_bytes, upload


def _as(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.mark.django_db
def test_jobs_are_listed_filtered_and_shown(api, ready_version):
    queued = upload(api, ready_version.model_id, "v2", onnx_bytes()).json()
    other = api.post("/api/v1/models/", {"name": "other"}, format="json").json()
    upload(api, other["id"], "o1", onnx_bytes())

    page = api.get("/api/v1/conversion-jobs/")
    assert page.status_code == 200, page.content
    rows = page.json()["results"]
    assert [(r["version_info"]["model"], r["version_info"]["label"]) for r in rows] == [
        ("other", "o1"),
        ("classifier", "v2"),
        ("classifier", "v1"),
    ]
    done = next(r for r in rows if r["version"] == str(ready_version.pk))
    assert done["status"] == "succeeded" and done["progress"] == 1.0 and done["error"] == ""
    assert done["log"] and set(done["log"][0]) == {"at", "message"}

    def labels(query: str) -> list[str]:
        answer = api.get(f"/api/v1/conversion-jobs/?{query}")
        assert answer.status_code == 200, answer.content
        return [r["version_info"]["label"] for r in answer.json()["results"]]

    assert labels("status=succeeded") == ["v1"]
    assert labels("status=queued&status=running") == ["o1", "v2"]
    assert labels(f"model={ready_version.model_id}") == ["v2", "v1"]
    assert labels(f"version={queued['id']}") == ["v2"]
    assert labels("limit=1&ordering=created_at") == ["v1"]
    first = api.get("/api/v1/conversion-jobs/?limit=2").json()
    assert len(first["results"]) == 2 and len(api.get(first["next"]).json()["results"]) == 1
    for bad in ("status=done", "model=abc", "version=1", "sort=x", "limit=0"):
        assert api.get(f"/api/v1/conversion-jobs/?{bad}").status_code == 400, bad

    detail = api.get(f"/api/v1/conversion-jobs/{done['id']}/")
    assert detail.status_code == 200 and detail.json() == done and detail["ETag"]
    assert api.get("/api/v1/conversion-jobs/999999999/").status_code == 404


@pytest.mark.django_db
def test_the_package_streams_to_admins_only_and_is_404_while_converting(api, operator, ready_version):
    url = f"/api/v1/versions/{ready_version.pk}/package/"
    answer = api.get(url)
    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/octet-stream"
    assert "classifier-v1.ferry" in answer["Content-Disposition"]
    data = b"".join(answer.streaming_content)
    digest = hashlib.sha256(data).hexdigest()
    assert digest == ready_version.package.sha256 and answer["ETag"] == f'"{digest}"'
    assert int(answer["Content-Length"]) == len(data) == ready_version.package.size

    refused = _as(operator[1]).get(url)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    converting = upload(api, ready_version.model_id, "v2", onnx_bytes()).json()
    pending = api.get(f"/api/v1/versions/{converting['id']}/package/")
    assert pending.status_code == 404 and pending.json()["error"]["code"] == "package_not_ready"
