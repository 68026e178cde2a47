"""Release counters signed into packages, and rollback packages re-signed with a newer counter."""

from __future__ import annotations

import tarfile

from ferry_cloud.release_key import release_public_key
from registry import storage
from registry.models import ModelVersion
from registry.services import conversion_run, version_rollback_package

from converter.samples import build_image_classifier
from deploy.package import SignedClaims, read_claims
from tests.platform.conftest import onnx_bytes, upload


def _claims(artifact) -> SignedClaims:
    with storage.local_copy(artifact.file.name, ".ferry") as path:
        return read_claims(path, release_public_key()).claims


def _members(artifact) -> dict[str, bytes]:
    with storage.local_copy(artifact.file.name, ".ferry") as path, tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _second_version(api, model_id: int) -> ModelVersion:
    created = upload(api, model_id, "v2", onnx_bytes(build_image_classifier(seed=3)))
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    return version


def test_counters_go_up_and_a_rollback_is_newer_than_everything(api, ready_version):
    first = _claims(ready_version.package)
    assert first == SignedClaims(counter=first.counter, device_class="*", rollback=False)
    second = _second_version(api, ready_version.model_id)
    assert _claims(second.package).counter > first.counter

    rollback = version_rollback_package(version=ready_version)
    claims = _claims(rollback)
    assert claims.rollback and claims.counter > _claims(second.package).counter
    old, back = _members(ready_version.package), _members(rollback)
    assert {k: v for k, v in old.items() if k != "manifest.sig"} == {
        k: v for k, v in back.items() if k != "manifest.sig"
    }
    ready_version.refresh_from_db()
    assert ready_version.rollback_package == rollback
    assert version_rollback_package(version=ready_version) == rollback  # nothing newer signed: reused


def test_rerunning_a_conversion_signs_the_same_bytes(ready_version):
    digest, counter = ready_version.package.sha256, ready_version.signed_counter
    ready_version.job.status = "running"
    ready_version.job.save()
    conversion_run(job_id=ready_version.job.pk)
    ready_version.refresh_from_db()
    assert (ready_version.package.sha256, ready_version.signed_counter) == (digest, counter)
