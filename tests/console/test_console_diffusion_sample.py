"""A diffusion version's console page shows its sample image (the health check's 2-step image,
read from the stored package on the S3 server), permission-checked like the page itself."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from console.pages.samples import RangedObject, package_stream
from django.test import Client
from playwright.sync_api import expect
from registry.models import ModelVersion
from registry.services import conversion_run
from registry.storage import local_copy

from converter.diffusion.sample import sample_image
from tests.agent.diffusion.png import decode_png
from tests.console.browser import login, screenshot
from tests.engine.diffusion import tiny
from tests.platform.conftest import upload

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'<img src="(/versions/[^"]+/sample\.png)"[^>]*width="(\d+)" height="(\d+)"')


def tar_of(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname=directory.name)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def layout_tar(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return tar_of(tiny.write_layout(tmp_path_factory.mktemp("sample") / "tiny-sd"))


@pytest.fixture
def diffusion_version(api, layout_tar) -> ModelVersion:
    """A converted diffusion version, through the API and the real conversion service."""
    model = api.post("/api/v1/models/", {"name": "painter"}, format="json").json()
    created = upload(
        api, model["id"], "v1", layout_tar, kind="diffusion", weights="fp32", image_size=64, steps=2
    )
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version


def recorded_image(version: ModelVersion, tmp: Path) -> np.ndarray:
    """The selftest.npy the converter put in the package, read the long way (whole archive)."""
    with local_copy(version.package.file.name) as path, tarfile.open(path) as tar:
        tar.extract("selftest.npy", tmp, filter="data")
    return np.load(tmp / "selftest.npy")


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_version_page_shows_the_sample_image_as_png(diffusion_version, viewer, outsider, tmp_path):
    page = client_of(viewer[0]).get(f"/versions/{diffusion_version.pk}/")
    assert page.status_code == 200
    found = IMG.search(page.content.decode())
    assert found, "no sample <img> on the version page"
    url, width, height = found.group(1), int(found.group(2)), int(found.group(3))
    size = diffusion_version.report["selftest"]["size"]
    assert (width, height) == (size, size)

    response = client_of(viewer[0]).get(url)
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    assert response.content[:8] == PNG_SIGNATURE
    image = decode_png(response.content)
    assert image.shape == (size, size, 3)
    np.testing.assert_array_equal(image, recorded_image(diffusion_version, tmp_path))
    assert image.std() > 0  # a real picture, not a blank

    etag = response["ETag"]
    assert diffusion_version.package.sha256 in etag and "private" in response["Cache-Control"]
    again = client_of(viewer[0]).get(url, headers={"if-none-match": etag})
    assert again.status_code == 304 and not again.content

    # another organisation's admin: neither the page nor the image exists for them
    stranger = client_of(outsider[0])
    assert stranger.get(f"/versions/{diffusion_version.pk}/").status_code == 404
    refused = stranger.get(url)
    assert refused.status_code == 404 and refused.content[:8] != PNG_SIGNATURE
    assert stranger.get(url, headers={"if-none-match": etag}).status_code == 404


def test_an_onnx_version_has_no_sample(ready_version, viewer):
    client = client_of(viewer[0])
    assert 'id="sample"' not in client.get(f"/versions/{ready_version.pk}/").content.decode()
    assert client.get(f"/versions/{ready_version.pk}/sample.png").status_code == 404


def test_the_sample_is_read_by_ranges_not_by_downloading_the_package(diffusion_version):
    package = diffusion_version.package
    with package_stream(package) as stream:
        image = sample_image(stream)
        raw = stream.raw
    assert image.ndim == 3
    assert isinstance(raw, RangedObject), "the test settings store packages on the S3 server"
    assert 0 < raw.fetched < package.size / 2, (raw.fetched, package.size)


@pytest.mark.browser
def test_the_sample_image_loads_in_the_browser(
    transactional_db, diffusion_version, live_server, offline_page
):
    page = offline_page
    login(page, live_server)
    page.goto(f"{live_server.url}/versions/{diffusion_version.pk}/")
    image = page.locator("#sample img")
    expect(image).to_be_visible()
    size = diffusion_version.report["selftest"]["size"]
    page.wait_for_function("document.querySelector('#sample img').complete")
    assert page.evaluate("document.querySelector('#sample img').naturalWidth") == size
    screenshot(page, "version-sample")
