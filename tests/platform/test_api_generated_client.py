"""An automation author's path: fetch the OpenAPI document, generate a typed client with
openapi-python-client, import every module, and run upload -> release -> watch through it
against a live server, unmodified."""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from fleet.services import device_enrol, enrolment_token_create
from registry.models import ModelVersion
from registry.services import conversion_run

from tests.platform.conftest import onnx_bytes

CONFIG = (
    "project_name_override: ferry-client\npackage_name_override: ferry_generated_client\npost_hooks: []\n"
)


def _generate(document: dict, where: Path) -> Path:
    (where / "openapi.json").write_text(json.dumps(document))
    (where / "config.yaml").write_text(CONFIG)
    generator = Path(sys.executable).with_name("openapi-python-client")
    done = subprocess.run(
        [
            str(generator),
            "generate",
            "--path",
            "openapi.json",
            "--config",
            "config.yaml",
            "--output-path",
            "out",
        ],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr  # nothing it had to skip
    return where / "out"


@pytest.mark.slow
def test_a_generated_client_imports_and_runs_the_automation_flow(
    live_server, api, org, tmp_path, monkeypatch
):
    package_root = _generate(api.get("/api/schema/?format=json").json(), tmp_path)
    monkeypatch.syspath_prepend(str(package_root))
    client_package = importlib.import_module("ferry_generated_client")
    names = [m.name for m in pkgutil.walk_packages(client_package.__path__, "ferry_generated_client.")]
    for name in names:  # a module that fails to import fails here, naming itself
        importlib.import_module(name)
    assert len(names) > 50

    from ferry_generated_client import AuthenticatedClient
    from ferry_generated_client.api.v1 import (
        v1_audit_list,
        v1_devices_list,
        v1_models_create,
        v1_models_versions_create,
        v1_release_events_list,
        v1_releases_action,
        v1_releases_create,
        v1_releases_retrieve,
        v1_versions_retrieve,
        v1_webhooks_create,
    )
    from ferry_generated_client.models import (
        ActionInputRequest,
        Error,
        EventTypesEnum,
        ModelInputRequest,
        ReleaseInputRequest,
        TargetInputRequest,
        V1AuditListTypeItem,
        V1ReleasesActionAction,
        VersionInputRequest,
        WebhookInputRequest,
    )
    from ferry_generated_client.types import File

    token = api._credentials["HTTP_AUTHORIZATION"].split()[1]
    client = AuthenticatedClient(base_url=live_server.url, token=token, prefix="Token")
    device = device_enrol(
        token=enrolment_token_create(organisation=org).token,
        name="cam",
        attributes={},
        labels={"site": "lab"},
    ).device

    model = v1_models_create.sync(client=client, body=ModelInputRequest(name="flow"), idempotency_key="m-1")
    upload = VersionInputRequest(file=File(payload=io.BytesIO(onnx_bytes()), file_name="m.onnx"), label="v1")
    version = v1_models_versions_create.sync(model.id, client=client, body=upload)
    assert version.package_sha256 is None
    conversion_run(job_id=ModelVersion.objects.get(pk=version.id).job.pk)  # the worker's part
    assert v1_versions_retrieve.sync(str(version.id), client=client).status.value == "ready"

    body = ReleaseInputRequest(
        name="nightly", version=version.id, target=TargetInputRequest(device_ids=[device.pk]), start=True
    )
    release = v1_releases_create.sync(client=client, body=body)
    assert release.state.value == "active" and release.version == version.id
    paused = v1_releases_action.sync(
        str(release.id), V1ReleasesActionAction.PAUSE, client=client, body=ActionInputRequest(reason="watch")
    )
    assert paused.state.value == "paused"
    assert v1_releases_retrieve.sync(str(release.id), client=client).revision == paused.revision
    events = v1_release_events_list.sync(str(release.id), client=client)
    assert [e.action for e in events.results][-1] == "pause"
    feed = v1_audit_list.sync(client=client, type_=[V1AuditListTypeItem.RELEASE_PAUSED])
    assert [(e.type_, e.release) for e in feed.results] == [("release.paused", release.id)]
    hook = WebhookInputRequest(
        url="https://hooks.example.com/ferry", event_types=[EventTypesEnum.RELEASE_PAUSED]
    )
    assert v1_webhooks_create.sync(client=client, body=hook).secret.startswith("whsec_")
    devices = v1_devices_list.sync(client=client, filter_="labels.site == lab")
    assert [d.id for d in devices.results] == [device.pk]

    refused = v1_models_create.sync(client=client, body=ModelInputRequest(name="flow"))
    assert isinstance(refused, Error) and refused.error.code == "conflict"
