"""Roles on every REST endpoint: each URL pattern x each method its view allows x each caller.

The endpoints come from Django's URL resolver, not from a list kept here, so a new endpoint is
walked the day it is added. Its view must declare one role permission
(accounts/permissions.py); the test reads that declaration and expects, for every method:

- anonymous: 401 {"error": {"code": "not_authenticated"}};
- an admin of another organisation: 404 on a URL naming one of Acme's rows, and on the others
  an answer that holds none of Acme's ids or names;
- a member below the declared role: 403 {"error": {"code": "permission_denied"}};
- a member at or above it: anything but 401 and 403.

Each request runs in a savepoint that is rolled back, so every caller meets the same rows.
DECLARED pins the matrix itself: changing who may do what means changing it here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from accounts.api import OrganisationApi
from accounts.models import Membership
from accounts.permissions import OperatorWrites, ViewerQueries, declared_permission
from accounts.tokens import api_token_create
from django.db import transaction
from django.http import HttpResponse
from django.urls import URLPattern, URLResolver, get_resolver
from fleet.api import DeviceRevokeApi
from fleet.services import device_enrol, device_group_create, enrolment_token_create
from releases.services import release_create
from rest_framework.test import APIClient, APIRequestFactory
from webhooks.services import deliveries_create, webhook_create

VIEWER, OPERATOR, ADMIN = Membership.Role.VIEWER, Membership.Role.RELEASE_MANAGER, Membership.Role.ADMIN

# URL names outside the role rules, each with the reason.
PUBLIC = {
    "healthz": "liveness probe, no data",
    "readyz": "readiness probe, names failing dependencies only",
    "metrics": "Prometheus scrape; README: expose only to the monitoring network",
    "schema": "the OpenAPI document describes endpoints, holds no tenant data",
    "api-docs": "Swagger UI over the schema",
    "api-not-found": "the JSON 404 of any path under /api/ no endpoint serves",
    "console:login": "where anonymous people are sent",
    "console:logout": "ends the caller's own session",
}

# The matrix, by URL name and method (HEAD and OPTIONS follow GET: viewer).
DECLARED: dict[str, dict[str, str]] = {
    "api:models": {"GET": VIEWER, "POST": OPERATOR},
    "api:model": {"GET": VIEWER},
    "api:model-versions": {"GET": VIEWER, "POST": OPERATOR},
    "api:versions": {"GET": VIEWER},
    "api:version": {"GET": VIEWER, "DELETE": OPERATOR},
    "api:version-package": {"GET": ADMIN},
    "api:conversion-jobs": {"GET": VIEWER},
    "api:conversion-job": {"GET": VIEWER},
    "api:enrolment-tokens": {"GET": VIEWER, "POST": ADMIN},
    "api:enrolment-token-revoke": {"POST": ADMIN},
    "api:devices": {"GET": VIEWER},
    "api:devices-bulk": {"POST": OPERATOR},  # revoke: admins (the view checks; see test_api_bulk)
    "api:device": {"GET": VIEWER, "PATCH": OPERATOR},
    "api:device-telemetry": {"GET": VIEWER},
    "api:device-revoke": {"POST": ADMIN},
    "api:device-pin": {"POST": OPERATOR},
    "api:device-groups": {"GET": VIEWER, "POST": OPERATOR},
    "api:device-filter-preview": {"POST": VIEWER},
    "api:device-group": {"GET": VIEWER, "PATCH": OPERATOR, "DELETE": OPERATOR},
    "api:releases": {"GET": VIEWER, "POST": OPERATOR},
    "api:release": {"GET": VIEWER, "PATCH": OPERATOR},
    "api:release-gate": {"POST": OPERATOR},
    "api:release-events": {"GET": VIEWER},
    "api:api-tokens": {"GET": VIEWER, "POST": VIEWER},
    "api:api-token": {"GET": VIEWER, "DELETE": VIEWER},
    "api:audit": {"GET": VIEWER},
    "api:release-devices": {"GET": VIEWER},
    "api:release-action": {"POST": OPERATOR},
    "api:fleet-summary": {"GET": VIEWER},
    "api:events-stream": {"GET": VIEWER},
    "api:webhooks": {"GET": ADMIN, "POST": ADMIN},
    "api:webhook": {"GET": ADMIN, "PATCH": ADMIN, "DELETE": ADMIN},
    "api:webhook-rotate-secret": {"POST": ADMIN},
    "api:webhook-deliveries": {"GET": ADMIN},
    "api:webhook-delivery": {"GET": ADMIN},
    "api:webhook-redeliver": {"POST": ADMIN},
}

RANK = {VIEWER: 0, OPERATOR: 1, ADMIN: 2}


@dataclass(frozen=True)
class Endpoint:
    name: str
    route: str
    callback: object

    @property
    def params(self) -> list[str]:
        return re.findall(r"<(?:\w+:)?(\w+)>", self.route)

    def url(self, values: dict[str, str]) -> str:
        return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(values[m.group(1)]), self.route)


def endpoints() -> list[Endpoint]:
    """Every URL pattern the project serves, with its namespaced name."""
    return list(_walk(get_resolver().url_patterns, "", ""))


def _walk(patterns, prefix: str, namespace: str) -> Iterator[Endpoint]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = ":".join(filter(None, [namespace, pattern.namespace or ""]))
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            name = f"{namespace}:{pattern.name}" if namespace else str(pattern.name)
            yield Endpoint(name=name, route=prefix + str(pattern.pattern), callback=pattern.callback)


def rest_endpoints() -> list[Endpoint]:
    return [e for e in endpoints() if e.name.startswith("api:")]


def allowed_methods(view_class: type) -> list[str]:
    methods = [m.upper() for m in view_class.http_method_names if m != "head" and hasattr(view_class, m)]
    return methods + (["HEAD"] if hasattr(view_class, "get") else [])


def required_roles(endpoint: Endpoint) -> dict[str, str | None]:
    """What the view declares for each method it allows (None: no declaration at all)."""
    view_class = getattr(endpoint.callback, "cls", None)
    permission = declared_permission(view_class) if view_class else None
    methods = allowed_methods(view_class) if view_class else ["GET"]
    return {m: permission.required_role(m) if permission else None for m in methods}


def test_every_url_is_classified():
    unknown = [
        e.name for e in endpoints() if e.name not in PUBLIC and not e.name.startswith(("api:", "console:"))
    ]
    assert not unknown, f"URL patterns with no role rules and not listed PUBLIC: {unknown}"


def test_every_rest_view_declares_a_role_for_every_method_it_allows():
    missing = {e.name: [m for m, role in required_roles(e).items() if role is None] for e in rest_endpoints()}
    missing = {name: methods for name, methods in missing.items() if methods}
    assert not missing, f"declare a role permission (accounts/permissions.py) on: {missing}"


def test_the_declared_matrix_is_the_documented_one():
    declared = {
        e.name: {m: r for m, r in required_roles(e).items() if m not in ("HEAD", "OPTIONS")}
        for e in rest_endpoints()
    }
    assert declared == DECLARED
    safe = {
        (e.name, m, r)
        for e in rest_endpoints()
        for m, r in required_roles(e).items()
        if m in ("HEAD", "OPTIONS")
    }
    assert {r for *_, r in safe} <= {VIEWER, ADMIN}  # webhooks: admins read them too


def test_a_view_without_a_declaration_refuses_everyone(admin):
    class Forgotten(OrganisationApi):
        def get(self, request):
            raise AssertionError("reached the handler")

    assert declared_permission(Forgotten) is None
    request = APIRequestFactory().get("/forgotten/", HTTP_AUTHORIZATION=f"Token {admin[1]}")
    response = Forgotten.as_view()(request)
    assert response.status_code == 403
    assert response.data["error"]["code"] == "permission_denied"


def test_a_method_the_view_lacks_is_405_not_a_refusal(api):
    assert required_roles(next(e for e in rest_endpoints() if e.name == "api:devices"))["GET"] == VIEWER
    assert api.delete("/api/v1/devices/").status_code == 405
    assert OperatorWrites.required_role("DELETE") == OPERATOR


# ---- the walk ----------------------------------------------------------------------------------


@dataclass
class World:
    values: dict[str, str]  # URL parameter -> one of Acme's rows
    secrets: list[str]  # what of Acme's must never reach another tenant
    bodies: dict[tuple[str, str], dict]
    clients: dict[str, tuple[APIClient, str | None]]  # caller -> (client, its role in Acme)


def _client(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def world(org, admin, viewer, operator, outsider, ready_version, settings) -> World:
    settings.FERRY_SSE_MAX_SECONDS = 0.2  # the event stream ends at once: its body is read whole
    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    spare_api_token = api_token_create(membership=org.memberships.get(user=admin[0]), name="spare").record
    spare_token = enrolment_token_create(organisation=org, labels={"site": "spare"}).record
    device = device_enrol(
        token=token, name="acme-secret-device", attributes={}, labels={"site": "lab"}
    ).device
    group = device_group_create(
        organisation=org, name="acme-secret-group", kind="static", device_ids=[str(device.pk)]
    )
    release = release_create(
        organisation=org,
        version=ready_version,
        name="acme-secret-release",
        target={"device_ids": [str(device.pk)]},
        actor=admin[0],
        start=True,
    )
    webhook = webhook_create(organisation=org, url="https://example.com/acme-secret-hook", event_types=[])
    delivery = deliveries_create(
        organisation_id=org.pk, event_id=1, event_type="release.started", payload={"id": 1}
    )[0]
    values = {
        "webhook_id": webhook.pk,
        "delivery_id": delivery.pk,
        "model_id": ready_version.model_id,
        "version_id": ready_version.pk,
        "device_id": device.pk,
        "group_id": group.pk,
        "release_id": release.pk,
        "action": "pause",
        "token_id": spare_token.pk,
        "job_id": ready_version.job.pk,
        "api_token_id": spare_api_token.pk,
    }
    bodies = {
        ("api:models", "POST"): {"name": "roles-model"},
        ("api:device-pin", "POST"): {"version": None},
        ("api:device", "PATCH"): {"labels": {"site": "lab"}},
        ("api:device-groups", "POST"): {"name": "roles-group"},
        ("api:device-filter-preview", "POST"): {"filter": "site == lab"},
        ("api:device-group", "PATCH"): {"name": "renamed"},
        ("api:releases", "POST"): {"name": "roles-release", "version": str(ready_version.pk)},
        ("api:release-action", "POST"): {"reason": "roles"},
        ("api:release", "PATCH"): {"priority": 3},
        ("api:devices-bulk", "POST"): {"filter": "site == lab", "action": "unpin", "dry_run": True},
        ("api:webhooks", "POST"): {"url": "https://example.com/roles"},
        ("api:webhook", "PATCH"): {"active": False},
    }
    row_numbers = ("model_id", "token_id", "api_token_id", "job_id")  # small integers: any page may hold them
    secrets = [str(v) for k, v in values.items() if k != "action" and k not in row_numbers]
    secrets += [
        "acme-secret-hook",
        "acme-secret-device",
        "acme-secret-group",
        "acme-secret-release",
        ready_version.model.name,
    ]
    clients = {
        "anonymous": (_client(None), None),
        "outsider": (_client(outsider[1]), None),
        "viewer": (_client(viewer[1]), VIEWER),
        "operator": (_client(operator[1]), OPERATOR),
        "admin": (_client(admin[1]), ADMIN),
    }
    return World(values=values, secrets=secrets, bodies=bodies, clients=clients)


def _request(client: APIClient, method: str, url: str, body: dict | None):
    """One request in a savepoint rolled back afterwards: the next caller sees the same rows."""
    data = json.dumps(body) if body is not None else ""
    with transaction.atomic():
        response = client.generic(method, url, data=data, content_type="application/json")
        if response.streaming:  # the event stream: read it whole (it ends soon)
            streamed, response = response, HttpResponse(b"".join(response.streaming_content))
            response.status_code, response.request = streamed.status_code, streamed.request
        transaction.set_rollback(True)
    return response


def _says(response, code: str) -> bool:
    """The answer carries the error code (a HEAD answer has no body to carry one)."""
    if response.request["REQUEST_METHOD"] == "HEAD":
        return True
    try:
        return response.json()["error"]["code"] == code
    except (ValueError, KeyError, TypeError):
        return False


def verdict(
    caller: str,
    role: str | None,
    required: str,
    endpoint: Endpoint,
    method: str,
    response,
    request_text: str,
    world: World,
) -> str | None:
    """What is wrong with the answer (None: it is what the matrix says)."""
    status = response.status_code
    if caller == "anonymous":
        return None if status == 401 and _says(response, "not_authenticated") else f"{status}, want 401"
    if caller == "outsider":
        if endpoint.params and method != "OPTIONS":
            return None if status == 404 else f"{status}, want 404"
        text = response.content.decode(errors="replace")
        leaked = [s for s in world.secrets if s in text and s not in request_text]
        if leaked:
            return f"{status} holds Acme's {leaked}"
        return None if status not in (401, 403) else f"{status}, want their own answer"
    if RANK[role] < RANK[required]:
        return None if status == 403 and _says(response, "permission_denied") else f"{status}, want 403"
    return None if status not in (401, 403) else f"{status}, want it allowed"


def walk(endpoint: Endpoint, world: World, roles: dict[str, str | None]) -> list[str]:
    failures = []
    url = endpoint.url(world.values)
    for method, required in roles.items():
        body = world.bodies.get((endpoint.name, method))
        request_text = url + json.dumps(body)
        for caller, (client, role) in world.clients.items():
            response = _request(client, method, url, body)
            wrong = verdict(caller, role, required, endpoint, method, response, request_text, world)
            if wrong:
                failures.append(f"{method} {url} as {caller}: {wrong}: {response.content[:200]!r}")
    return failures


@pytest.mark.parametrize("endpoint", rest_endpoints(), ids=lambda e: e.name)
def test_every_endpoint_answers_every_caller_as_its_role_says(endpoint: Endpoint, world: World):
    roles = required_roles(endpoint)
    assert None not in roles.values(), f"{endpoint.name} declares no role"
    failures = walk(endpoint, world, roles)
    assert not failures, "\n".join(failures)


def test_the_walk_notices_a_view_that_lets_too_much_through(world: World, monkeypatch):
    """The checker is only as good as its verdicts: revocation opened to viewers must fail it."""
    monkeypatch.setattr(DeviceRevokeApi, "permission_classes", [ViewerQueries])
    endpoint = next(e for e in rest_endpoints() if e.name == "api:device-revoke")
    failures = walk(endpoint, world, {"POST": ADMIN})
    assert [f.split(": ")[0].rsplit(" as ", 1)[1] for f in failures] == ["viewer", "operator"]
