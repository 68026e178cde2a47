"""Roles on every console page: each URL pattern x each method its view declares x each caller.

The console's URL patterns come from the resolver (tests/platform/test_roles.py walks them);
every view must carry ``required_roles`` (console.views.role_required), and the test expects:
anonymous people are sent to the login page; another organisation's admin gets 404 for one of
Acme's rows and never sees Acme's ids or names elsewhere; a member below the role gets a 403
page naming the role it needs; at or above, neither 403 nor the login page. Then the
templates: a viewer is shown no action button, an operator the ones it may use.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from django.db import transaction
from django.test import Client
from fleet.models import Device

from tests.platform.test_roles import ADMIN, OPERATOR, PUBLIC, RANK, VIEWER, Endpoint, endpoints, world  # noqa: F401

DECLARED: dict[str, dict[str, str]] = {
    "console:dashboard": {"GET": VIEWER, "HEAD": VIEWER},
    "console:dashboard-live": {"GET": VIEWER, "HEAD": VIEWER},
    "console:redoc": {"GET": VIEWER, "HEAD": VIEWER},
    "console:redoc-bundle": {"GET": VIEWER, "HEAD": VIEWER},
    "console:models": {"GET": VIEWER, "HEAD": VIEWER, "POST": OPERATOR},
    "console:model": {"GET": VIEWER, "HEAD": VIEWER, "POST": OPERATOR},
    "console:model-live": {"GET": VIEWER, "HEAD": VIEWER},
    "console:version": {"GET": VIEWER, "HEAD": VIEWER},
    "console:version-job": {"GET": VIEWER, "HEAD": VIEWER},
    "console:version-sample": {"GET": VIEWER, "HEAD": VIEWER},
    "console:groups": {"GET": VIEWER, "HEAD": VIEWER, "POST": OPERATOR},
    "console:group-pin": {"POST": OPERATOR},
    "console:devices": {"GET": VIEWER, "HEAD": VIEWER},
    "console:devices-bulk": {"POST": OPERATOR},
    "console:device": {"GET": VIEWER, "HEAD": VIEWER},
    "console:device-live": {"GET": VIEWER, "HEAD": VIEWER},
    "console:device-pin": {"POST": OPERATOR},
    "console:release-new": {"GET": OPERATOR, "HEAD": OPERATOR, "POST": OPERATOR},
    "console:release-preview": {"GET": OPERATOR, "HEAD": OPERATOR},
    "console:release": {"GET": VIEWER, "HEAD": VIEWER},
    "console:release-live": {"GET": VIEWER, "HEAD": VIEWER},
    "console:release-canary": {"GET": VIEWER, "HEAD": VIEWER},
    "console:release-canary-chart": {"GET": VIEWER, "HEAD": VIEWER},
    "console:release-gate": {"POST": OPERATOR},
    "console:release-action": {"POST": OPERATOR},
}

BODIES: dict[tuple[str, str], dict[str, str]] = {
    ("console:groups", "POST"): {"name": "roles-group", "kind": "static"},
    ("console:models", "POST"): {"name": "roles-model"},
    ("console:model", "POST"): {"label": "roles-version"},  # no file: the form refuses it
    ("console:group-pin", "POST"): {"version": ""},
    ("console:device-pin", "POST"): {"version": ""},
    ("console:devices-bulk", "POST"): {"action": "unpin"},
    ("console:release-action", "POST"): {"reason": "roles"},
}


def console_endpoints() -> list[Endpoint]:
    return [e for e in endpoints() if e.name.startswith("console:") and e.name not in PUBLIC]


def test_every_console_view_declares_its_roles():
    declared = {e.name: getattr(e.callback, "required_roles", None) for e in console_endpoints()}
    undeclared = [name for name, roles in declared.items() if not roles]
    assert not undeclared, f"decorate with console.views.role_required: {undeclared}"
    assert declared == DECLARED


@pytest.fixture
def callers(admin, viewer, operator, outsider) -> dict[str, tuple[Client, str | None]]:
    def logged_in(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return {
        "anonymous": (Client(), None),
        "outsider": (logged_in(outsider[0]), None),
        "viewer": (logged_in(viewer[0]), VIEWER),
        "operator": (logged_in(operator[0]), OPERATOR),
        "admin": (logged_in(admin[0]), ADMIN),
    }


def _request(client: Client, method: str, url: str, body: dict[str, str]):
    with transaction.atomic():  # rolled back: every caller meets the same rows
        response = client.generic(
            method, url, data=urlencode(body), content_type="application/x-www-form-urlencoded"
        )
        transaction.set_rollback(True)
    return response


def _to_login(response) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/login/")


def verdict(
    caller, role, required, endpoint: Endpoint, method, response, request_text, secrets
) -> str | None:
    status, text = response.status_code, response.content.decode(errors="replace")
    if caller == "anonymous":
        return None if _to_login(response) else f"{status}, want a redirect to the login page"
    if _to_login(response):
        return "sent a logged-in member to the login page"
    if caller == "outsider":
        if endpoint.params:
            return None if status == 404 else f"{status}, want 404"
        leaked = [s for s in secrets if s in text and s not in request_text]
        return f"{status} shows Acme's {leaked}" if leaked else (f"{status}" if status == 403 else None)
    if RANK[role] < RANK[required]:
        named = method == "HEAD" or "role or above" in text
        return None if status == 403 and named else f"{status}, want a 403 page naming the role"
    return None if status != 403 else "403, want it allowed"


@pytest.mark.parametrize("endpoint", console_endpoints(), ids=lambda e: e.name)
def test_every_page_answers_every_caller_as_its_role_says(endpoint: Endpoint, world, callers):  # noqa: F811
    url = endpoint.url(world.values)
    failures = []
    for method, required in endpoint.callback.required_roles.items():
        body = BODIES.get((endpoint.name, method), {})
        request_text = url + urlencode(body)
        for caller, (client, role) in callers.items():
            response = _request(client, method, url, body)
            wrong = verdict(caller, role, required, endpoint, method, response, request_text, world.secrets)
            if wrong:
                failures.append(f"{method} {url} as {caller}: {wrong}")
    assert not failures, "\n".join(failures)


def test_a_viewer_refused_a_post_is_told_which_role_it_needs(world, callers):  # noqa: F811
    client = callers["viewer"][0]
    release_id = world.values["release_id"]
    response = client.post(f"/releases/{release_id}/pause/", {"reason": "viewer tries"})
    assert response.status_code == 403
    assert "This needs the operator role or above; you are a viewer in Acme." in response.content.decode()
    assert client.get(f"/releases/{release_id}/").content.decode().count("viewer tries") == 0


def _pages(world) -> list[str]:  # noqa: F811
    values = world.values
    return [
        "/",
        "/groups/",
        f"/releases/{values['release_id']}/",
        "/models/",
        f"/models/{values['model_id']}/",
        f"/versions/{values['version_id']}/",
        "/devices/",
        f"/devices/{values['device_id']}/",
    ]


def _without_searches(html: str) -> str:
    """The page less its GET forms (search and filter boxes change nothing)."""
    return re.sub(r'<form method="get".*?</form>', "", html, flags=re.S)


def test_a_viewer_is_shown_no_action_button(world, callers):  # noqa: F811
    client = callers["viewer"][0]
    for page in _pages(world):
        html = _without_searches(client.get(page).content.decode())
        # the only button left is the header's Log out; the only POST form, its form
        assert html.count("<button") == 1 and "Log out</button>" in html, page
        assert html.count('method="post"') == 1, page
    dashboard = client.get("/").content.decode()
    assert "New release" not in dashboard and "(not pinned)" in dashboard
    version = client.get(f"/versions/{world.values['version_id']}/").content.decode()
    assert "Release this version" not in version and "Digest (sha256)" in version


def test_an_operator_is_shown_the_actions_it_may_use(world, callers):  # noqa: F811
    client = callers["operator"][0]
    dashboard, groups, release, *_ = (client.get(page).content.decode() for page in _pages(world))
    assert "New release" in dashboard and ">Pause</button>" in dashboard and ">Pin</button>" in dashboard
    assert ">Pin</button>" in groups and "Create group</button>" in groups
    assert ">Evaluate now</button>" in release and ">Pause</button>" in release
    version = client.get(f"/versions/{world.values['version_id']}/").content.decode()
    assert "Release this version</a>" in version
    devices = client.get("/devices/").content.decode()
    assert "Review…</button>" in devices and 'value="revoke"' not in devices  # revoking: admins
    assert "Save pin</button>" in client.get(f"/devices/{world.values['device_id']}/").content.decode()


def test_revoking_devices_in_bulk_is_an_admins(world, callers):  # noqa: F811
    device_id = world.values["device_id"]
    body = {"action": "revoke", "device": device_id, "confirmed": "yes"}
    refused = callers["operator"][0].post("/devices/bulk/", body)
    assert refused.status_code == 403 and "admin role or above" in refused.content.decode()
    assert Device.objects.get(pk=device_id).revoked_at is None
    assert 'value="revoke"' in callers["admin"][0].get("/devices/").content.decode()
    done = callers["admin"][0].post("/devices/bulk/", body)
    assert done.status_code == 302 and Device.objects.get(pk=device_id).revoked_at is not None
