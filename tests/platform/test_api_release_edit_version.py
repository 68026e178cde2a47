"""PATCH /api/v1/releases/<id>/ to another version: the version the draft left is released only
while another release still names it (it can change and be deleted again); the new one is."""

from __future__ import annotations

import pytest
from registry.models import ModelVersion
from registry.services import conversion_run

from tests.platform.conftest import onnx_bytes, upload


def _second_version(api, first: ModelVersion) -> ModelVersion:
    created = upload(api, first.model_id, "v2", onnx_bytes())
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


def _draft(api, version: ModelVersion, name: str) -> str:
    body = {"name": name, "version": str(version.pk), "target": {"labels": {"site": "lab"}}}
    created = api.post("/api/v1/releases/", {**body, "allow_empty": True}, format="json")
    assert created.status_code == 201, created.content
    return created.json()["id"]


def _to_version(api, release_id: str, version: ModelVersion):
    body = {"version": str(version.pk), "allow_empty": True}
    return api.patch(f"/api/v1/releases/{release_id}/", body, format="json")


def _released(api, version: ModelVersion) -> bool:
    answer = api.get(f"/api/v1/versions/{version.pk}/")
    assert answer.status_code == 200, answer.content
    return answer.json()["released"]


def _release_names_of(api, version: ModelVersion) -> list[str]:
    rows = api.get("/api/v1/releases/", {"version": str(version.pk)}).json()["results"]
    return sorted(r["name"] for r in rows)


@pytest.mark.django_db
def test_editing_a_draft_to_another_version_releases_that_one_and_frees_the_old(api, ready_version):
    v1, v2 = ready_version, _second_version(api, ready_version)
    draft = _draft(api, v1, "draft")
    assert (_released(api, v1), _released(api, v2)) == (True, False)

    edited = _to_version(api, draft, v2)
    assert edited.status_code == 200, edited.content
    assert edited.json()["version"] == str(v2.pk)
    assert (_released(api, v1), _released(api, v2)) == (False, True)
    assert _release_names_of(api, v1) == [] and _release_names_of(api, v2) == ["draft"]
    # no longer released: its options may change again, and it may go
    assert api.delete(f"/api/v1/versions/{v1.pk}/").status_code == 204
    refused = api.delete(f"/api/v1/versions/{v2.pk}/")
    assert refused.status_code == 409, refused.content


@pytest.mark.django_db
def test_the_old_version_stays_released_while_another_release_names_it(api, ready_version):
    v1, v2 = ready_version, _second_version(api, ready_version)
    draft = _draft(api, v1, "draft")
    _draft(api, v1, "another")
    assert _to_version(api, draft, v2).status_code == 200
    assert (_released(api, v1), _released(api, v2)) == (True, True)
    assert _release_names_of(api, v1) == ["another"]

    back = _to_version(api, draft, v1)
    assert back.status_code == 200, back.content
    assert (_released(api, v1), _released(api, v2)) == (True, False)


@pytest.mark.django_db
def test_a_refused_edit_changes_no_version_flag(api, ready_version):
    v1, v2 = ready_version, _second_version(api, ready_version)
    draft = _draft(api, v1, "draft")
    # the version is valid, the target matches nothing without allow_empty: the whole edit is refused
    refused = api.patch(
        f"/api/v1/releases/{draft}/",
        {"version": str(v2.pk), "target": {"labels": {"site": "nowhere"}}},
        format="json",
    )
    assert refused.status_code == 400, refused.content
    assert (_released(api, v1), _released(api, v2)) == (True, False)
