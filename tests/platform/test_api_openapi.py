"""The OpenAPI document is precise enough to generate a client from, and the server keeps to it:
one content type per body, every query parameter and error answer declared, and real answers
(errors, nulls while converting, the health gate's events) valid against their schemas."""

from __future__ import annotations

import io
import re

import pytest
from fleet.services import device_enrol, enrolment_token_create
from openapi_schema_validator import OAS30Validator, OAS31Validator
from openapi_spec_validator import validate

from tests.platform.conftest import onnx_bytes


@pytest.fixture
def document(api) -> dict:
    response = api.get("/api/schema/?format=json")
    assert response.status_code == 200
    doc = response.json()
    validate(doc)
    return doc


def _operations(doc: dict):
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if path.startswith("/api/v1/") and isinstance(operation, dict) and "responses" in operation:
                yield path, method, operation


@pytest.mark.django_db
def test_the_document_declares_bodies_parameters_and_errors(document):
    for path, method, operation in _operations(document):
        where = f"{method.upper()} {path}"
        content = operation.get("requestBody", {}).get("content", {})
        if path == "/api/v1/models/{model_id}/versions/" and method == "post":
            assert list(content) == ["multipart/form-data"], where
            name = content["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]
            schema = document["components"]["schemas"][name]["properties"]["file"]
            assert schema.get("format") == "binary" or schema.get("contentMediaType"), schema
        else:
            assert list(content) in ([], ["application/json"]), (where, list(content))
        for code in ("400", "401", "403", "404", "500"):
            answer = operation["responses"][code]["content"]["application/json"]["schema"]
            assert answer == {"$ref": "#/components/schemas/Error"}, where
        for parameter in operation.get("parameters", []):
            if (
                parameter["name"].endswith("_id")
                and parameter["in"] == "path"
                and "model" in parameter["name"]
            ):
                assert parameter["schema"]["type"] == "integer", where
        # /releases/{id}/devices/ belongs to the rollout-status work, which declares its own parameters
        if operation["operationId"].endswith("_list") and path != "/api/v1/releases/{release_id}/devices/":
            names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
            assert {"limit", "cursor", "ordering"} <= names, where
    devices = next(o for p, m, o in _operations(document) if p == "/api/v1/devices/" and m == "get")
    assert {p["name"] for p in devices["parameters"]} >= {"filter", "group", "version", "last_seen_after"}
    action = next(
        p
        for p in document["paths"]["/api/v1/releases/{release_id}/{action}/"]["post"]["parameters"]
        if p["name"] == "action"
    )
    assert "rollback" in action["schema"]["enum"]
    states = document["components"]["schemas"]["ReleaseOutput"]["properties"]["state"]
    assert "$ref" in states or "enum" in states or "allOf" in states


class Conformance:
    """Checks real answers against the document's schema for their path, method and status."""

    def __init__(self, doc: dict) -> None:
        self.doc = doc
        self.routes = [
            (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path) for path in doc["paths"]
        ]
        self.checked = 0

    def __call__(self, response, method: str, url: str):
        path = url.split("?")[0]
        templates = [t for rx, t in self.routes if rx.match(path)]
        template = min(templates, key=lambda t: t.count("{"))  # /releases/{id}/events/ before {action}
        answers = self.doc["paths"][template][method.lower()]["responses"]
        declared = answers.get(str(response.status_code))
        assert declared is not None, (method, url, response.status_code, sorted(answers))
        if response.status_code == 204:
            return response
        schema = {**declared["content"]["application/json"]["schema"], "components": self.doc["components"]}
        validator = OAS31Validator if self.doc["openapi"].startswith("3.1") else OAS30Validator
        errors = sorted(validator(schema).iter_errors(response.json()), key=str)
        assert not errors, (method, url, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]])
        self.checked += 1
        return response


@pytest.mark.django_db
def test_real_answers_keep_to_the_document(api, org, document, ready_version):
    check = Conformance(document)

    def call(method: str, url: str, body=None, **extra):
        kwargs = {"format": "json"} if body is not None else {}
        return check(getattr(api, method.lower())(url, body, **kwargs, **extra), method, url)

    model = call("POST", "/api/v1/models/", {"name": "conformance"}).json()
    converting = check(
        api.post(
            f"/api/v1/models/{model['id']}/versions/",
            {"file": io.BytesIO(onnx_bytes()), "label": "v1"},
            format="multipart",
        ),
        "POST",
        f"/api/v1/models/{model['id']}/versions/",
    ).json()
    assert converting["package_sha256"] is None  # declared nullable, and it is null
    call("GET", f"/api/v1/versions/{converting['id']}/")
    call("GET", "/api/v1/versions/?status=converting")
    call("GET", f"/api/v1/models/{model['id']}/")
    call("GET", "/api/v1/models/")

    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    device = device_enrol(token=token, name="d", attributes={}, labels={}).device
    call("GET", "/api/v1/devices/")
    call("GET", f"/api/v1/devices/{device.pk}/")
    call("PATCH", f"/api/v1/devices/{device.pk}/", {"labels": {"site": "lab"}})
    call("POST", f"/api/v1/devices/{device.pk}/pin/", {"version": None})
    call("POST", "/api/v1/enrolment-tokens/", {"labels": {}})
    call("GET", "/api/v1/enrolment-tokens/")
    group = call("POST", "/api/v1/device-groups/", {"name": "g", "device_ids": [str(device.pk)]}).json()
    call("GET", f"/api/v1/device-groups/{group['id']}/")
    call("GET", "/api/v1/device-groups/")

    body = {"name": "r", "version": str(ready_version.pk), "target": {"device_ids": [str(device.pk)]}}
    release = call("POST", "/api/v1/releases/", {**body, "start": True}).json()
    call("POST", f"/api/v1/releases/{release['id']}/gate/")
    call("POST", f"/api/v1/releases/{release['id']}/pause/", {"reason": "check"})
    call("GET", f"/api/v1/releases/{release['id']}/")
    call("GET", f"/api/v1/releases/{release['id']}/events/")
    call("GET", "/api/v1/releases/?state=paused")
    call("GET", "/api/v1/audit/")
    call("GET", "/api/v1/fleet/summary/")
    draft = call("POST", "/api/v1/releases/", {**body, "name": "draft"}).json()
    call("PATCH", f"/api/v1/releases/{draft['id']}/", {"priority": 5, "phases": [{"percentage": 50}]})
    call("PATCH", f"/api/v1/releases/{release['id']}/", {"priority": 5})  # 409: started
    call("POST", "/api/v1/devices/bulk/", {"filter": "site == lab", "action": "unpin", "dry_run": True})
    call(
        "POST",
        "/api/v1/devices/bulk/",
        {"device_ids": [str(device.pk)], "action": "label", "labels": {"a": "b"}},
    )
    jobs = call("GET", "/api/v1/conversion-jobs/?status=queued&status=succeeded").json()
    call("GET", f"/api/v1/conversion-jobs/{jobs['results'][0]['id']}/")
    call("GET", f"/api/v1/versions/{converting['id']}/package/")  # 404 while converting
    package = api.get(f"/api/v1/versions/{ready_version.pk}/package/")
    answers = document["paths"]["/api/v1/versions/{version_id}/package/"]["get"]["responses"]["200"]
    assert package.status_code == 200 and list(answers["content"]) == [package["Content-Type"]]

    # the error answers keep to the error schema too
    call("GET", "/api/v1/devices/?nope=1")
    call("GET", "/api/v1/versions/00000000-0000-0000-0000-000000000000/")
    call("POST", "/api/v1/releases/", {**body, "priority": 2**63})
    call("POST", "/api/v1/models/", {"name": "conformance"})
    call("POST", f"/api/v1/releases/{release['id']}/resume/", {}, HTTP_IF_MATCH='"stale"')
    call("DELETE", f"/api/v1/versions/{ready_version.pk}/")
    assert check.checked >= 36  # every call above but the 204s
