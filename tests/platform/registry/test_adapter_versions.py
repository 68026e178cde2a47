"""LoRA adapter versions (kind llm_adapter): a PEFT adapter directory uploaded as one archive with
the LLM version it was trained on (``base``), converted by the real conversion service against
the base's stored package into a small signed adapter package bound to the base's weights and
named after its model; releasing it to devices that do not run that base is refused, naming why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ferry_cloud.release_key import release_public_key
from registry.models import ModelVersion
from registry.services import conversion_run, llm_digest_of
from releases.models import Release
from rest_framework.test import APIClient

from deploy.package import verify_and_unpack
from tests.engine.llm.checkpoints import write_checkpoint, write_peft
from tests.platform.conftest import onnx_bytes, upload
from tests.platform.registry.test_checkpoint_uploads import post, tar_of
from tests.platform.releases.test_rollout_api import _create, _devices


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    config, _ = write_checkpoint(root / "tiny", "qwen2", max_position_embeddings=64)
    write_checkpoint(root / "other", "qwen2", seed=5, max_position_embeddings=64)
    write_peft(root / "pirate", config)
    return {"tiny": root / "tiny", "other": root / "other", "pirate": root / "pirate"}


def _model(api, name: str) -> int:
    return api.post("/api/v1/models/", {"name": name}, format="json").json()["id"]


def _converted(response) -> ModelVersion:
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


def _llm(api, directory: Path, model: str) -> ModelVersion:
    return _converted(post(api, _model(api, model), "v1", tar_of(directory), kind="llm", weights="int8"))


@pytest.mark.django_db(transaction=True)
def test_an_adapter_upload_converts_against_its_base_into_a_small_named_package(api, checkpoints, tmp_path):
    base = _llm(api, checkpoints["tiny"], "tiny")
    assert len(base.llm_digest) == 64  # recorded at conversion: what adapters bind to
    pirate_model = _model(api, "pirate")
    created = post(
        api, pirate_model, "v1", tar_of(checkpoints["pirate"]), kind="llm_adapter", base=str(base.pk)
    )
    assert created.json()["base"] == str(base.pk) and created.json()["kind"] == "llm_adapter"
    adapter = _converted(created)
    assert adapter.llm_digest == base.llm_digest == adapter.report["base_digest"]
    assert adapter.report["rank"] == 4 and "q_proj" in adapter.report["targets"]
    assert adapter.package.size < base.package.size / 2  # the low-rank matrices only, not the base

    with adapter.package.file.open("rb") as stored:
        (tmp_path / "pirate.ferry").write_bytes(stored.read())
    verify_and_unpack(tmp_path / "pirate.ferry", tmp_path / "unpacked", release_public_key())  # signed
    metadata = json.loads((tmp_path / "unpacked" / "manifest.json").read_text())["metadata"]
    assert metadata["kind"] == "llm-adapter" and metadata["name"] == "pirate"  # signed: the API's name
    assert metadata["adapter"]["base_digest"] == base.llm_digest

    # an llm version converted before llm_digest existed gets it from its package on first use
    ModelVersion.objects.filter(pk=base.pk).update(llm_digest="")
    base.refresh_from_db()
    assert llm_digest_of(base) == adapter.llm_digest
    assert ModelVersion.objects.get(pk=base.pk).llm_digest == adapter.llm_digest


def _error(response) -> tuple[str, dict]:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    return error["message"], error.get("fields", {})


@pytest.mark.django_db
def test_an_adapter_upload_without_a_usable_base_is_refused(api, checkpoints, ready_version, outsider):
    model = _model(api, "pirate")
    data = tar_of(checkpoints["pirate"])
    message, fields = _error(post(api, model, "v1", data, kind="llm_adapter"))
    assert "base" in fields and "needs base" in message
    message, fields = _error(post(api, model, "v1", data, kind="llm_adapter", base=str(ready_version.pk)))
    assert "base" in fields and "is a onnx version" in message
    message, fields = _error(post(api, model, "v1", data, kind="llm", base=str(ready_version.pk)))
    assert "base" in fields and "base is for kind llm_adapter" in message
    message, fields = _error(
        post(api, model, "v1", data, kind="llm_adapter", base=str(ready_version.pk), weights="int8")
    )
    assert "weights" in fields
    # another organisation's version is not a base here (and not told apart from a missing one)
    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION=f"Token {outsider[1]}")
    foreign = upload(theirs, _model(theirs, "globex"), "v1", onnx_bytes()).json()["id"]
    message, fields = _error(post(api, model, "v1", data, kind="llm_adapter", base=foreign))
    assert "base" in fields and f"No model version {foreign}" in message
    assert not ModelVersion.objects.filter(kind="llm_adapter").exists()


@pytest.mark.django_db(transaction=True)
def test_releasing_an_adapter_to_devices_without_its_base_is_refused(api, org, checkpoints, ready_version):
    base = _llm(api, checkpoints["tiny"], "tiny")
    other = _llm(api, checkpoints["other"], "other")
    created = post(
        api, _model(api, "pirate"), "v1", tar_of(checkpoints["pirate"]), kind="llm_adapter", base=str(base.pk)
    )
    adapter = _converted(created)
    on_base = _devices(org, 2, base, hardware="rpi4")

    shipped = _create(api, adapter, target={"device_ids": [str(d.pk) for d in on_base]}, allow_empty=False)
    assert shipped.status_code == 201, shipped.content  # devices running the base take it

    # devices running nothing, an ONNX model or another base cannot run the adapter
    bare = _devices(org, 1, None)
    onnx = _devices(org, 1, ready_version)
    elsewhere = _devices(org, 3, other)
    target = {"device_ids": [str(d.pk) for d in on_base + bare + onnx + elsewhere]}
    refused = _create(api, adapter, target=target, allow_empty=False, new_pipeline=True)
    message, _ = _error(refused)
    assert refused.json()["error"]["code"] == "incompatible_version"
    assert "does not fit what 5 of the targeted devices" in message
    assert "nothing on 1 device(s)" in message and "the device runs no LLM" in message
    assert "classifier:v1 on 1 device(s)" in message and "other:v1 on 3 device(s)" in message
    assert f"bound to base weights {base.llm_digest[:12]}" in message
    assert f"the device's LLM base is {other.llm_digest[:12]}" in message
    assert Release.objects.count() == 1  # no override ships an adapter without its base

    # a device running the adapter (its base beside it) fits another adapter version of that base
    running_adapter = _devices(org, 1, adapter)
    v2 = _converted(
        post(
            api, adapter.model_id, "v2", tar_of(checkpoints["pirate"]), kind="llm_adapter", base=str(base.pk)
        )
    )
    again = _create(api, v2, target={"device_ids": [str(d.pk) for d in running_adapter + on_base]})
    assert again.status_code == 201, again.content
