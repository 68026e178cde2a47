"""Revoking a device cuts its download in progress: the real gateway over mutual TLS, a slow
reader mid-transfer, and the device revoked between two chunks."""

from __future__ import annotations

import time

import grpc
import pytest
from fleet.models import Device
from fleet.services import device_revoke
from gateway import servicer
from registry.models import ModelVersion
from registry.services import conversion_run
from releases.services import release_create

from converter.samples import build_image_classifier
from tests.platform.conftest import onnx_bytes, upload
from tests.platform.gateway.devices import ATTRS, enrol, served


@pytest.fixture
def large_version(api) -> ModelVersion:
    """A converted version whose package is megabytes: more than the transport buffers in flight."""
    model = api.post("/api/v1/models/", {"name": "wide"}, format="json").json()
    wide = build_image_classifier(num_classes=200_000)
    created = upload(api, model["id"], "v1", onnx_bytes(wide))
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


@pytest.fixture
def gateway(transactional_db):
    with served() as gateway:
        yield gateway


def test_a_revoked_devices_running_download_is_cut(org, admin, large_version, gateway, monkeypatch):
    # small chunks so the package spans many of them and the slow reader is mid-transfer
    monkeypatch.setattr(servicer, "CHUNK_BYTES", 16 * 1024)
    client, device = enrol(gateway, org)
    release_create(
        organisation=org,
        version=large_version,
        name="v1",
        target={"device_ids": [device.device_id]},
        actor=admin[0],
        start=True,
    )
    digest = client.check_in(ATTRS, "", "").desired.package_digest
    size = large_version.package.size
    chunks = client.download(digest, 0, 60)
    received = len(next(chunks).data)
    device_revoke(device=Device.objects.get(pk=device.device_id))
    revoked_at = time.monotonic()
    with pytest.raises(grpc.RpcError) as cut:
        for chunk in chunks:
            received += len(chunk.data)
            time.sleep(0.01)  # a slow reader
    assert cut.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "revoked" in cut.value.details()
    assert received < size, "the whole package arrived after revocation"
    assert time.monotonic() - revoked_at < 3 * servicer.DOWNLOAD_REVOCATION_CHECK_SECONDS + 2
