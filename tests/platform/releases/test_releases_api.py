"""Releases: validation, the audited state machine, conflicts."""

from __future__ import annotations

from releases.models import Release


def _create(api, version, **extra):
    # no device is enrolled in these tests: the target is explicitly allowed to match none yet
    body = {
        "name": "r1",
        "version": str(version.pk),
        "target": {"labels": {"fleet": "demo"}},
        "allow_empty": True,
        **extra,
    }
    return api.post("/api/v1/releases/", body, format="json")


def test_release_lifecycle_is_audited(api, ready_version):
    created = _create(api, ready_version)
    assert created.status_code == 201, created.content
    release_id = created.json()["id"]
    assert created.json()["state"] == "draft"
    for action, state in [
        ("start", "active"),
        ("pause", "paused"),
        ("resume", "active"),
        ("abort", "aborted"),
    ]:
        response = api.post(
            f"/api/v1/releases/{release_id}/{action}/", {"reason": f"test {action}"}, format="json"
        )
        assert response.status_code == 200, response.content
        assert response.json()["state"] == state
    events = api.get(f"/api/v1/releases/{release_id}/").json()["events"]
    assert [e["action"] for e in events] == ["create", "start", "pause", "resume", "abort"]
    assert all(e["actor"] == "alice" for e in events)
    assert events[2]["reason"] == "test pause"


def test_repeated_action_is_a_no_op_and_impossible_one_conflicts(api, ready_version):
    release_id = _create(api, ready_version, start=True).json()["id"]
    assert api.post(f"/api/v1/releases/{release_id}/start/").status_code == 200
    assert Release.objects.get(pk=release_id).events.filter(action="start").count() == 1
    api.post(f"/api/v1/releases/{release_id}/abort/")
    conflict = api.post(f"/api/v1/releases/{release_id}/resume/")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["message"] == "Cannot resume a release that is aborted."
    unknown = api.post(f"/api/v1/releases/{release_id}/explode/")
    assert unknown.status_code == 400


def test_released_version_is_marked_immutable(api, ready_version):
    _create(api, ready_version)
    ready_version.refresh_from_db()
    assert ready_version.released


def test_bad_release_requests(api, ready_version):
    assert _create(api, ready_version, target={"percentage": 140}).status_code == 400
    assert _create(api, ready_version, target={"colour": "red"}).status_code == 400
    missing = api.post(
        "/api/v1/releases/", {"name": "x", "version": "00000000-0000-0000-0000-000000000000"}, format="json"
    )
    assert missing.status_code == 404


def test_unconverted_version_cannot_be_released(api, ready_version):
    ready_version.status = "converting"
    ready_version.save()
    response = _create(api, ready_version)
    assert response.status_code == 400
    assert "only a converted version" in response.json()["error"]["message"]
