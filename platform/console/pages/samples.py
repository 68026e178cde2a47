"""A diffusion version's sample image (the health check's 2-step image), served as PNG.

Permission-checked like the version page (another organisation's version is 404). The PNG is a
function of the package's bytes, so the package's sha256 is its ETag (a browser's revalidation is
a 304 without touching storage) and the cache key of the encoded PNG. On S3 the package is read
with ranged GETs (only the tar headers up to the sample and the sample itself), not downloaded.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from django.core.cache import cache
from django.http import HttpResponse
from django.utils.cache import get_conditional_response
from ferry_cloud.errors import DomainError, NotFound
from registry.models import Artifact, ModelVersion
from registry.selectors import version_get

from console.views import Role, error_page, organisation_of, role_required
from converter.diffusion.sample import NoSample, sample_png

log = logging.getLogger(__name__)
CACHE_SECONDS = 24 * 3600
READ_BLOCK = 1 << 16  # one ranged GET per 64 KiB: the small files before the graphs in one or two


class RangedObject(io.RawIOBase):
    """A stored S3 object (boto3's ``Object``) read by ranged GETs: seeking costs nothing."""

    def __init__(self, obj: Any, size: int) -> None:
        super().__init__()
        self._obj, self._size, self._pos = obj, size, 0
        self.fetched = 0  # bytes asked of the store, so far

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size or not len(buffer):
            return 0
        end = min(self._pos + len(buffer), self._size) - 1
        data = self._obj.get(Range=f"bytes={self._pos}-{end}")["Body"].read()
        buffer[: len(data)] = data
        self._pos += len(data)
        self.fetched += len(data)
        return len(data)


@contextmanager
def package_stream(artifact: Artifact) -> Iterator[BinaryIO]:
    """The stored package as a seekable stream; django-storages' S3 file would download it whole
    on the first read, so its ``obj`` is read by ranges instead."""
    with artifact.file.storage.open(artifact.file.name, "rb") as stored:
        obj = getattr(stored, "obj", None)
        if obj is None:
            yield stored
        else:
            yield io.BufferedReader(RangedObject(obj, artifact.size), READ_BLOCK)


def _cached_png(artifact: Artifact) -> bytes:
    key = f"console:sample-png:{artifact.sha256}"
    try:
        png = cache.get(key)
    except Exception:  # noqa: BLE001 - the cache is an optimisation: a down Redis must not 500
        log.warning("sample image cache unavailable", exc_info=True)
        png = None
    if png is None:
        with package_stream(artifact) as stream:
            png = sample_png(stream)
        try:
            cache.set(key, png, CACHE_SECONDS)
        except Exception:  # noqa: BLE001 - as above
            log.warning("sample image cache unavailable", exc_info=True)
    return png


@role_required(get=Role.VIEWER)
def version_sample(request, version_id: str):
    """The PNG of a ready diffusion version's sample image."""
    try:
        version = version_get(organisation=organisation_of(request), version_id=version_id)
        if version.kind != ModelVersion.Kind.DIFFUSION or version.package is None:
            raise NotFound("This version has no sample image: only converted diffusion versions do.")
    except DomainError as exc:
        return error_page(request, exc)
    etag = f'"{version.package.sha256}"'
    unchanged = get_conditional_response(request, etag=etag)
    if unchanged is not None:
        unchanged["Cache-Control"] = "private, max-age=3600"
        return unchanged
    try:
        png = _cached_png(version.package)
    except NoSample as exc:
        log.warning("version %s: no sample image: %s", version.pk, exc)
        return error_page(request, NotFound("This version's package holds no readable sample image."))
    response = HttpResponse(png, content_type="image/png")
    response["ETag"] = etag
    response["Cache-Control"] = "private, max-age=3600"  # private: the page is permission-checked
    return response
