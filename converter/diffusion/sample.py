"""A diffusion package's sample image, as PNG: the health check's 2-step image from a fixed seed.

The converter records it (``selftest.npy``) for the device's health check; the console shows it
on the version's page, so nothing is generated twice and conversion takes no longer.  It is read
from the stored package archive by walking tar headers up to that member: the package's members
are in a fixed order with the small files before the graphs, so on a store that can seek (local
files, ranged reads from S3) a multi-gigabyte package costs a few small reads.
"""

from __future__ import annotations

import io
import tarfile
from typing import BinaryIO

import numpy as np

from engine.diffusion.package import SELFTEST_IMAGE
from engine.diffusion.png import encode_png

MAX_SAMPLE_BYTES = 64 << 20  # a 4096x4096 RGB image is 48 MiB; the sample is far smaller


class NoSample(ValueError):
    """The archive holds no readable sample image (not a diffusion package, or a damaged one)."""


def sample_image(package: BinaryIO) -> np.ndarray:
    """The recorded image (uint8 [height, width, 3]) of the package archive read from ``package``."""
    try:
        with tarfile.open(fileobj=package, mode="r:") as tar:
            for member in iter(tar.next, None):
                if member.name == SELFTEST_IMAGE:
                    return _load(tar, member)
    except tarfile.TarError as exc:
        raise NoSample(f"the package is not a readable archive ({exc})") from exc
    raise NoSample(f"the package has no {SELFTEST_IMAGE}: it is not a diffusion package")


def sample_png(package: BinaryIO) -> bytes:
    """The package's sample image as PNG bytes."""
    return encode_png(sample_image(package))


def _load(tar: tarfile.TarFile, member: tarfile.TarInfo) -> np.ndarray:
    if not member.isfile() or member.size > MAX_SAMPLE_BYTES:
        raise NoSample(f"{SELFTEST_IMAGE} is not a regular file of at most {MAX_SAMPLE_BYTES} bytes")
    reader = tar.extractfile(member)
    assert reader is not None  # a regular file always has a reader
    try:
        image = np.load(io.BytesIO(reader.read()), allow_pickle=False)
    except ValueError as exc:
        raise NoSample(f"{SELFTEST_IMAGE} is not a numpy array ({exc})") from exc
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise NoSample(f"{SELFTEST_IMAGE} is {image.dtype} {image.shape}, not uint8 [h, w, 3]")
    return image
