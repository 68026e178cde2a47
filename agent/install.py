"""Download, verify, unpack, activate, health-check; roll back on failure.

On-disk layout under the state directory:
  downloads/<digest>.part   a download in progress (resumed from its size)
  versions/<version_id>/    an unpacked, verified package
  current -> versions/<id>  the active version, switched by an atomic rename
  previous -> versions/<id> what ran before, kept for rollback
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.client import GatewayClient
from agent.errors import ActivationError, DownloadError
from agent.files import fsync_dir, switch_symlink
from deploy.unpack import verify_and_unpack
from engine import Session
from engine.errors import EngineError
from engine.format import read_package

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Offer:
    release_id: str
    version_id: str
    version_label: str
    model_name: str
    package_digest: str
    package_size: int


class Installer:
    def __init__(self, state_dir: Path, client: GatewayClient, public_key: bytes) -> None:
        self.state_dir = state_dir
        self.client = client
        self.public_key = public_key
        for sub in ("downloads", "versions"):
            (state_dir / sub).mkdir(parents=True, exist_ok=True)

    @property
    def current_link(self) -> Path:
        return self.state_dir / "current"

    def current_version(self) -> str:
        """The active version's id ('' when none), read from the pointer itself."""
        if not self.current_link.is_symlink():
            return ""
        return Path(os.readlink(self.current_link)).name

    def download(self, offer: Offer, deadline_seconds: float = 300.0) -> Path:
        """Fetch the package, resuming a partial download; never accept more bytes than offered."""
        part = self.state_dir / "downloads" / f"{offer.package_digest}.part"
        offset = part.stat().st_size if part.exists() else 0
        if offset > offer.package_size:
            part.unlink()
            offset = 0
        if offset < offer.package_size:
            with open(part, "ab") as out:
                for chunk in self.client.download(offer.package_digest, offset, deadline_seconds):
                    if chunk.offset != offset or offset + len(chunk.data) > offer.package_size:
                        raise DownloadError(
                            f"gateway sent bytes {chunk.offset}..{chunk.offset + len(chunk.data)} "
                            f"of a package offered as {offer.package_size} bytes"
                        )
                    out.write(chunk.data)
                    offset += len(chunk.data)
                out.flush()
                os.fsync(out.fileno())
        if offset != offer.package_size or _sha256(part) != offer.package_digest:
            part.unlink()
            raise DownloadError(f"package {offer.package_digest[:12]} arrived with the wrong size or digest")
        return part

    def unpack(self, offer: Offer, archive: Path) -> Path:
        """Verify and unpack into versions/<id>, via a temporary directory renamed into place."""
        final = self.state_dir / "versions" / offer.version_id
        if final.exists():
            return final
        staging = self.state_dir / "versions" / f".{offer.version_id}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        verify_and_unpack(archive, staging, self.public_key)
        fsync_dir(staging)
        os.rename(staging, final)
        fsync_dir(final.parent)
        return final

    def activate(self, offer: Offer, directory: Path) -> None:
        """Switch to the new version; switch back if it fails its health check."""
        before = self.current_version()
        if before == offer.version_id:
            return
        if before:
            switch_symlink(self.state_dir / "previous", f"versions/{before}")
        switch_symlink(self.current_link, f"versions/{offer.version_id}")
        try:
            health_check(directory)
        except ActivationError:
            if before:
                switch_symlink(self.current_link, f"versions/{before}")
            else:
                self.current_link.unlink()
            raise

    def install(self, offer: Offer) -> None:
        archive = self.download(offer)
        directory = self.unpack(offer, archive)
        self.activate(offer, directory)
        archive.unlink(missing_ok=True)


def health_check(directory: Path) -> None:
    """Load the package and compare its self-test output with the one recorded at conversion."""
    started = time.perf_counter()
    try:
        session = Session(directory)
        package = read_package(directory, verify=False)  # the unpack just verified every byte
        selftest = package.manifest.get("metadata", {}).get("selftest")
        if not selftest:
            return
        feeds = {name: np.asarray(package.tensors[t]) for name, t in selftest["inputs"].items()}
        outputs = session.run(feeds)
        for name, tensor in selftest["outputs"].items():
            expected = package.tensors[tensor]
            if not np.allclose(
                outputs[name], expected, atol=selftest.get("atol", 1e-4), rtol=selftest.get("rtol", 1e-3)
            ):
                diff = float(np.max(np.abs(outputs[name] - expected)))
                raise ActivationError(
                    f"self-test output {name!r} differs from the expected one by {diff:.3g}"
                )
    except EngineError as exc:
        raise ActivationError(f"the new version does not load or run: {exc}") from exc
    log.info("health check passed in %.1f ms", 1000 * (time.perf_counter() - started))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
