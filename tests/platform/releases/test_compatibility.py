"""Release creation refuses a version that does not fit what the targeted devices run now."""

# ruff: noqa: F811 - the tests take the imported second_version fixture as an argument
from __future__ import annotations

from registry.models import ModelVersion
from registry.services import conversion_run
from releases.compatibility import compatibility
from releases.models import Release

from converter.samples import build_image_classifier
from tests.platform.conftest import onnx_bytes, upload
from tests.platform.releases.test_rollout_api import (  # noqa: F401 - second_version is a fixture
    _create,
    _devices,
    second_version,
)


def _converted(api, model_id: int, label: str, **shape) -> ModelVersion:
    created = upload(api, model_id, label, onnx_bytes(build_image_classifier(**shape)))
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


def test_an_incompatible_version_is_refused_naming_the_mismatch_and_the_devices(api, org, ready_version):
    _devices(org, 2, ready_version)
    _devices(org, 1, None)  # runs nothing yet: nothing to be incompatible with
    grey = _converted(api, ready_version.model_id, "grey", channels=1)
    refused = _create(api, grey, start=True, allow_empty=False)
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert error["code"] == "incompatible_version"
    message = error["message"]
    assert (
        "classifier:v1 on 2 device(s)" in message and "does not fit what 2 of the targeted devices" in message
    )
    assert "input 'image': dim 1 is 1 in the package, 3 on the device" in message
    assert "new_pipeline" in message
    assert not Release.objects.exists()  # nothing half-made

    shipped = _create(api, grey, start=True, allow_empty=False, new_pipeline=True)
    assert shipped.status_code == 201, shipped.content
    assert shipped.json()["state"] == "active"
    created = next(e for e in shipped.json()["events"] if e["action"] == "create")
    assert "ships a new pipeline" in created["reason"]  # the override is in the audit log
    assert created["details"]["new_pipeline"] is True and created["details"]["compatibility"]["affected"] == 2


def test_a_compatible_version_and_a_target_of_other_devices_pass(api, org, ready_version, second_version):
    devices = _devices(org, 2, ready_version, hardware="rpi4")
    created = _create(api, second_version, allow_empty=False)
    assert created.status_code == 201, created.content
    # fewer classes: the devices' post-processing reads 10 scores, the new version gives 5
    narrow = _converted(api, ready_version.model_id, "narrow", num_classes=5)
    verdict = compatibility(version=narrow, device_ids=[str(d.pk) for d in devices])
    assert not verdict.fits and verdict.affected == 2 and verdict.checked == 2
    assert verdict.as_dict()["incompatible"][0]["mismatches"] == [
        "output 'probabilities': dim 1 is 5 in the package, 10 on the device (package [N, 5], device [N, 10])"
    ]
    # a target that does not reach those devices is not held back by them
    others = _create(api, narrow, target={"filter": "hardware == jetson"}, allow_empty=True)
    assert others.status_code == 201, others.content
    # devices that already run the version are not asked
    assert compatibility(version=ready_version, device_ids=[str(d.pk) for d in devices]).checked == 0


def test_new_pipeline_must_be_a_boolean(api, ready_version):
    refused = _create(api, ready_version, new_pipeline="perhaps")
    assert refused.status_code == 400
    assert "new_pipeline" in refused.content.decode()
