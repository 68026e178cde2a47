"""API tokens as a user meets them: created once, hashed at rest, scoped, expiring, revocable."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

import pytest
from accounts.models import ApiToken
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_a_token_is_shown_once_stored_hashed_listed_and_revoked(api, admin):
    made = api.post("/api/v1/api-tokens/", {"name": "ci", "role": "viewer", "days": 7})
    assert made.status_code == 201, made.content
    token = made.json()["token"]
    assert token.startswith(f"fat_{made.json()['id']}_")
    assert made.json()["role"] == "viewer"
    record = ApiToken.objects.get(pk=made.json()["id"])
    secret = token.split("_", 2)[2]
    assert record.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(ApiToken.objects.filter(pk=record.pk).values().get())
    assert timedelta(days=6, hours=23) < record.expires_at - timezone.now() <= timedelta(days=7)

    ci = _client(token)
    assert ci.get("/api/v1/devices/").status_code == 200
    listed = api.get("/api/v1/api-tokens/").json()
    assert record.pk in [row["id"] for row in listed["results"]]
    assert all("token" not in row for row in listed["results"])

    revoked = api.delete(f"/api/v1/api-tokens/{record.pk}/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    refused = ci.get("/api/v1/devices/")
    assert refused.status_code == 401
    assert "revoked" in refused.json()["error"]["message"]


def test_the_default_lifetime_is_the_setting(api):
    with override_settings(FERRY_API_TOKEN_DAYS=3):
        made = api.post("/api/v1/api-tokens/", {})
    record = ApiToken.objects.get(pk=made.json()["id"])
    assert timedelta(days=2, hours=23) < record.expires_at - timezone.now() <= timedelta(days=3)


def test_an_expired_token_is_refused(api):
    made = api.post("/api/v1/api-tokens/", {}).json()
    ApiToken.objects.filter(pk=made["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = _client(made["token"]).get("/api/v1/devices/")
    assert refused.status_code == 401
    assert "expired" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    "bad",
    ["fat_1_" + "A" * 43, "fat_999999_" + "A" * 43, "not-a-token", "fat_x_y", "0" * 40],
)
def test_a_wrong_or_malformed_token_is_refused(api, bad):
    refused = _client(bad).get("/api/v1/devices/")
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "Invalid API token."


def test_a_wrong_secret_for_a_real_id_is_refused(api):
    made = api.post("/api/v1/api-tokens/", {}).json()
    forged = made["token"][:-4] + ("AAAA" if not made["token"].endswith("AAAA") else "BBBB")
    assert _client(forged).get("/api/v1/devices/").status_code == 401


def test_the_tokens_role_caps_the_users_role(api, admin):
    viewer_token = api.post("/api/v1/api-tokens/", {"role": "viewer"}).json()["token"]
    as_viewer = _client(viewer_token)
    assert as_viewer.get("/api/v1/devices/").status_code == 200
    refused = as_viewer.post("/api/v1/enrolment-tokens/", {})
    assert refused.status_code == 403
    assert "viewer" in refused.json()["error"]["message"]
    assert api.post("/api/v1/enrolment-tokens/", {}).status_code == 201
    # a viewer-scoped token cannot mint a stronger one
    stronger = as_viewer.post("/api/v1/api-tokens/", {"role": "admin"})
    assert stronger.status_code == 403
    assert as_viewer.post("/api/v1/api-tokens/", {}).json()["role"] == "viewer"


def test_a_member_cannot_give_a_token_more_than_their_role(viewer):
    refused = _client(viewer[1]).post("/api/v1/api-tokens/", {"role": "operator"})
    assert refused.status_code == 403
    assert "at most your role" in refused.json()["error"]["message"]
    assert not ApiToken.objects.filter(role="release_manager", user=viewer[0]).exists()


def test_members_see_and_revoke_their_own_admins_everyones(api, viewer, operator, outsider):
    own = _client(viewer[1]).post("/api/v1/api-tokens/", {"name": "mine"}).json()
    theirs = _client(operator[1]).post("/api/v1/api-tokens/", {"name": "olga's"}).json()
    seen = {row["id"] for row in _client(viewer[1]).get("/api/v1/api-tokens/").json()["results"]}
    assert own["id"] in seen and theirs["id"] not in seen
    assert _client(viewer[1]).delete(f"/api/v1/api-tokens/{theirs['id']}/").status_code == 404
    assert _client(outsider[1]).delete(f"/api/v1/api-tokens/{own['id']}/").status_code == 404
    assert _client(viewer[1]).delete(f"/api/v1/api-tokens/{own['id']}/").status_code == 200
    assert api.delete(f"/api/v1/api-tokens/{theirs['id']}/").status_code == 200
    assert _client(theirs["token"]).get("/api/v1/devices/").status_code == 401


def test_bad_input_is_refused_and_creates_nothing(api):
    before = ApiToken.objects.count()
    for body in ({"days": 0}, {"days": "soon"}, {"role": "owner"}, {"scope": "all"}):
        assert api.post("/api/v1/api-tokens/", body).status_code == 400, body
    with override_settings(FERRY_API_TOKEN_MAX_DAYS=30):
        assert api.post("/api/v1/api-tokens/", {"days": 31}).status_code == 400
    assert ApiToken.objects.count() == before


def test_the_management_command_creates_lists_and_revokes(admin):
    out = io.StringIO()
    call_command("api_token", "alice", "--role", "operator", "--days", "5", "--name", "deploy", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("fat_")
    assert _client(token).get("/api/v1/devices/").status_code == 200
    token_id = int(token.split("_")[1])
    listing = io.StringIO()
    call_command("api_token", "alice", "--list", stdout=listing)
    assert f"{token_id}\toperator" in listing.getvalue() and token not in listing.getvalue()
    call_command("api_token", "alice", "--revoke", str(token_id), stdout=io.StringIO())
    assert _client(token).get("/api/v1/devices/").status_code == 401
    with pytest.raises(CommandError, match="No user"):
        call_command("api_token", "nobody")
