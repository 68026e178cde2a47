"""One error format under /api/: every refusal, whoever makes it (a domain service, DRF,
Django's router, a bug), answers JSON {"error": {"code", "message", "fields"?}}."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from tests.platform.conftest import member_of


def _error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) <= {"code", "message", "fields"} and {"code", "message"} <= set(error), error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"], error
    return error


@pytest.mark.django_db
def test_every_refusal_speaks_the_one_error_format(api, org, monkeypatch):
    # routes nobody serves: JSON, not Django's HTML page, and no redirect that drops a POST body
    _error(api.get("/api/v1/no-such-thing/"), 404, "not_found")
    _error(api.get("/api/v2/models/"), 404, "not_found")
    slash = _error(api.get("/api/v1/models"), 404, "not_found")
    assert "/api/v1/models/" in slash["message"]  # it says where the endpoint is
    _error(api.post("/api/v1/models", {"name": "m"}, format="json"), 404, "not_found")
    _error(api.get("/api/v1/models/99999999999999999999999/"), 404, "not_found")
    _error(api.get("/api/v1/models/424242/"), 404, "not_found")

    # who may: 401 without a credential, 401 with a wrong one, 403 below the role
    _error(APIClient().get("/api/v1/models/"), 401, "not_authenticated")
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Token nope")
    _error(wrong.get("/api/v1/models/"), 401, "authentication_failed")
    viewer = APIClient()
    viewer.credentials(HTTP_AUTHORIZATION=f"Token {member_of(org, 'vera', 'viewer')[1]}")
    _error(viewer.post("/api/v1/models/", {"name": "m"}, format="json"), 403, "permission_denied")

    # what: 405, 415, a malformed body, invalid fields, a clash
    _error(api.delete("/api/v1/models/"), 405, "method_not_allowed")
    _error(
        api.generic("POST", "/api/v1/models/", "name=m", content_type="text/plain"),
        415,
        "unsupported_media_type",
    )
    _error(
        api.generic("POST", "/api/v1/models/", "{not json", content_type="application/json"),
        400,
        "parse_error",
    )
    invalid = _error(api.post("/api/v1/models/", {"name": "../etc"}, format="json"), 400, "invalid")
    assert set(invalid["fields"]) == {"name"}
    assert api.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    _error(api.post("/api/v1/models/", {"name": "m"}, format="json"), 409, "conflict")

    # too large: 413 before the body is parsed
    huge = json.dumps({"name": "m", "description": "x" * (11 << 20)})
    _error(
        api.generic("POST", "/api/v1/models/", huge, content_type="application/json"),
        413,
        "request_too_large",
    )

    # a bug: 500 in the same shape, the cause logged and not shown
    def broken(**kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("registry.selectors.model_list", broken)
    failed = _error(api.get("/api/v1/models/"), 500, "server_error")
    assert "secret" not in failed["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("priority", [2**63, -(2**63), 2**31, 10**400])
def test_integers_out_of_range_are_400_naming_the_field(api, ready_version, priority):
    body = {"name": "r", "version": str(ready_version.pk), "priority": priority, "allow_empty": True}
    error = _error(api.post("/api/v1/releases/", body, format="json"), 400, "invalid")
    assert set(error["fields"]) == {"priority"}


@pytest.mark.django_db
def test_integers_in_phases_and_windows_are_range_checked(api, ready_version):
    body = {
        "name": "r",
        "version": str(ready_version.pk),
        "allow_empty": True,
        "phases": [{"percentage": 10, "min_soak_seconds": 2**63}],
        "window": {"cron": "0 2 * * *", "duration_seconds": 2**40},
    }
    error = _error(api.post("/api/v1/releases/", body, format="json"), 400, "invalid")
    assert set(error["fields"]) == {"phases", "window"}


@pytest.mark.django_db
def test_a_throttled_caller_gets_429_with_retry_after_in_the_error_format(api, settings):
    settings.FERRY_API_RATE = "1/hour"  # the real throttle, counting in the suite's Redis
    assert api.get("/api/v1/models/").status_code == 200
    throttled = api.get("/api/v1/models/")
    _error(throttled, 429, "throttled")
    assert int(throttled["Retry-After"]) > 0
