"""Download, verify, unpack, activate, health-check; the steps the update lifecycle drives.

On-disk layout under the state directory:
  downloads/<digest>.part   a download in progress (resumed from its size)
  versions/<version_id>/    an unpacked, verified package
  versions/.<id>.staging/   an unpack in progress (thrown away on restart)
  current -> versions/<id>  the active version, switched by an atomic rename
  previous -> versions/<id> what ran before, kept for rollback

An offer here is built from a verified signed assignment (agent.trust): its digest, size,
version id and manifest digest are the control plane's signed words, and ids are opaque
tokens (deploy.trust.assignment refuses anything path-like).  A download must match the
assigned archive's size and sha256 before it is unpacked; then deploy.package checks the
signature, the device class, the organisation and the assigned manifest digest, and hashes
every file as it streams to disk.  The engine loads the unpacked directory without hashing it
again.

numpy and the engine are imported only when a package is checked or loaded, so an idle
agent with no model stays small.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ActivationError, DiskFullError, DownloadError, DownloadStalled, IncompatibleModel
from agent.files import fsync_dir, switch_symlink
from deploy.errors import PackageRejected
from deploy.package import ClaimsCheck, VerifiedManifest, file_sha256, read_claims, verify_and_unpack
from deploy.trust.assignment import Assignment

log = logging.getLogger(__name__)

DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


@dataclass(frozen=True)
class Offer:
    release_id: str
    version_id: str
    version_label: str
    model_name: str
    package_digest: str
    package_size: int
    download_only: bool = False
    rollback: bool = False
    window: dict[str, Any] | None = None  # {"cron", "duration_seconds", "timezone"}
    counter: int = 0  # the signed assignment's counter
    manifest_sha256: str = ""  # the manifest digest the assignment names ("" : not checked)

    @classmethod
    def assigned(cls, assignment: Assignment, version_label: str = "", model_name: str = "") -> Offer:
        """The offer a verified assignment makes; the labels are display text only."""
        return cls(
            release_id=assignment.release_id,
            version_id=assignment.version_id,
            version_label=version_label,
            model_name=model_name,
            package_digest=assignment.package_digest,
            package_size=assignment.package_size,
            download_only=assignment.download_only,
            rollback=assignment.rollback,
            window=assignment.window,
            counter=assignment.counter,
            manifest_sha256=assignment.manifest_sha256,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Offer:
        return cls(**data)

    def same_package(self, other: Offer | None) -> bool:
        return other is not None and (other.version_id, other.package_digest) == (
            self.version_id,
            self.package_digest,
        )


@dataclass(frozen=True)
class DownloadRules:
    """Limits on one download attempt; a stalled or slow link keeps its partial file for the next try."""

    deadline_seconds: float = 600.0
    min_bytes_per_second: float = 1024.0
    speed_window_seconds: float = 30.0
    reserve_bytes: int = 16 << 20  # free space left on the disk after the package and its unpacked copy


@dataclass
class Installer:
    state_dir: Path
    client: Any  # GatewayClient (None in tests that never download)
    public_key: bytes
    rules: DownloadRules = field(default_factory=DownloadRules)
    # the whole trusted release-key set (agent.trust.ReleaseKeys, shared and rotated in place):
    # a package converted before a rotation stays installable while its key is still in the set
    trusted_keys: list[bytes] | None = None

    def __post_init__(self) -> None:
        for sub in ("downloads", "versions"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)

    @property
    def current_link(self) -> Path:
        return self.state_dir / "current"

    @property
    def previous_link(self) -> Path:
        return self.state_dir / "previous"

    def current_version(self) -> str:
        """The active version's id ('' when none), read from the pointer itself."""
        return _link_target(self.current_link)

    def previous_version(self) -> str:
        return _link_target(self.previous_link)

    def part_file(self, offer: Offer) -> Path:
        return self.state_dir / "downloads" / f"{offer.package_digest}.part"

    # --- download -------------------------------------------------------------------------
    def check_free_space(self, offer: Offer) -> None:
        part = self.part_file(offer)
        have = part.stat().st_size if part.exists() else 0
        # the archive, then its unpacked copy (about the same size), then the reserve
        needed = 2 * offer.package_size - have + self.rules.reserve_bytes
        free = shutil.disk_usage(self.state_dir).free
        if free < needed:
            raise DiskFullError(
                f"not enough free space for package {offer.package_digest[:12]}: needs {needed} bytes "
                f"(package {offer.package_size}, unpacked copy, reserve {self.rules.reserve_bytes}), "
                f"{free} free"
            )

    def download(self, offer: Offer) -> Path:
        """Fetch the package, resuming a partial download; never accept more bytes than offered."""
        part = self.part_file(offer)
        offset = part.stat().st_size if part.exists() else 0
        if offset > offer.package_size:
            part.unlink()
            offset = 0
        if offset < offer.package_size:
            self.check_free_space(offer)
            try:
                offset = self._fetch(offer, part, offset)
            except OSError as exc:
                if exc.errno in DISK_FULL_ERRNOS:
                    part.unlink(missing_ok=True)
                    raise DiskFullError(
                        f"the disk filled up while downloading package {offer.package_digest[:12]} "
                        f"at byte {offset} of {offer.package_size} ({os.strerror(exc.errno)})"
                    ) from exc
                raise
        if offset != offer.package_size:
            part.unlink()
            raise _arrived_wrong(offer)
        return part  # its digest is checked only if verifying refuses it (see unpack)

    def _fetch(self, offer: Offer, part: Path, offset: int) -> int:
        started = window_start = time.monotonic()
        window_bytes = 0
        with open(part, "ab") as out:
            try:
                for chunk in self.client.download(offer.package_digest, offset, self.rules.deadline_seconds):
                    if chunk.offset != offset or offset + len(chunk.data) > offer.package_size:
                        out.close()
                        part.unlink(missing_ok=True)
                        raise DownloadError(
                            f"gateway sent bytes {chunk.offset}..{chunk.offset + len(chunk.data)} "
                            f"of a package offered (and signed) as {offer.package_size} bytes"
                        )
                    out.write(chunk.data)
                    offset += len(chunk.data)
                    window_bytes += len(chunk.data)
                    now = time.monotonic()
                    if now - window_start >= self.rules.speed_window_seconds:
                        speed = window_bytes / (now - window_start)
                        if speed < self.rules.min_bytes_per_second and offset < offer.package_size:
                            raise DownloadStalled(
                                f"download of {offer.package_digest[:12]} is too slow ({speed:.0f} B/s, "
                                f"minimum {self.rules.min_bytes_per_second:.0f}); resuming later at {offset}"
                            )
                        window_start, window_bytes = now, 0
            finally:
                if not out.closed:
                    out.flush()
                    os.fsync(out.fileno())  # what arrived survives a power cut, so the resume is honest
        log.info(
            "downloaded %s: %d bytes in %.1f s", offer.package_digest[:12], offset, time.monotonic() - started
        )
        return offset

    # --- verify and unpack ------------------------------------------------------------------
    def staging_dir(self, offer: Offer) -> Path:
        return self.state_dir / "versions" / f".{offer.version_id}.staging"

    def unpack(self, offer: Offer, archive: Path, check: ClaimsCheck | None = None) -> Path:
        """Verify and unpack into versions/<id>, via a staging directory renamed into place.

        An archive that is not the assigned one (its sha256 differs) is the download's fault:
        DownloadError, and the archive is deleted for a fresh download.
        """
        if file_sha256(archive) != offer.package_digest:
            archive.unlink(missing_ok=True)
            raise _arrived_wrong(offer)
        return self._unpack(offer, archive, check)

    def _key_for(self, archive: Path) -> bytes:
        """The trusted key that signed this archive (checking only its head), else ``public_key``,
        whose refusal then says why."""
        for key in self.trusted_keys or []:
            try:
                read_claims(archive, key)
                return key
            except Exception:  # noqa: BLE001 - the unpack below refuses it again, with its reason
                continue
        return self.public_key

    def _unpack(self, offer: Offer, archive: Path, check: ClaimsCheck | None) -> Path:
        final = self.state_dir / "versions" / offer.version_id
        staging = self.staging_dir(offer)
        shutil.rmtree(staging, ignore_errors=True)  # a half-unpacked leftover of a crash
        if final.exists():
            # unpacked before (a version kept on disk, assigned again): check its claims anyway
            if check is not None:
                check(read_claims(archive, self._key_for(archive)))
            return final
        verify_and_unpack(archive, staging, self._key_for(archive), check=check)
        for child in staging.iterdir():
            fd = os.open(child, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(staging)
        os.rename(staging, final)
        fsync_dir(final.parent)
        return final

    # --- activate -------------------------------------------------------------------------
    def switch_to(self, version_id: str) -> None:
        """Point `current` at versions/<id> (previous keeps what ran before); idempotent."""
        before = self.current_version()
        if before == version_id:
            return
        if before:
            switch_symlink(self.previous_link, f"versions/{before}")
        switch_symlink(self.current_link, f"versions/{version_id}")

    def switch_back(self, version_id: str) -> None:
        """Make version_id current again ('' = nothing active) without touching `previous`."""
        if version_id:
            switch_symlink(self.current_link, f"versions/{version_id}")
        elif self.current_link.is_symlink():
            self.current_link.unlink()
            fsync_dir(self.state_dir)

    def discard(self, offer: Offer) -> None:
        """Forget a refused package: its partial download and any half-unpacked copy."""
        self.part_file(offer).unlink(missing_ok=True)
        shutil.rmtree(self.staging_dir(offer), ignore_errors=True)

    def prune(self, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Delete unpacked versions other than current, previous and ``keep`` (the adapters
        installed beside current): a small disk keeps two bases."""
        keep = {self.current_version(), self.previous_version(), *keep}
        removed = []
        for directory in (self.state_dir / "versions").iterdir():
            if directory.name not in keep and not directory.name.startswith("."):
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory.name)
        return removed


def health_check(directory: Path, recent_events: Path | None = None) -> None:
    """Load the package and compare its self-test output with the one recorded at conversion;
    when it carries a pipeline, check that the pipeline's features fit the model's inputs and
    run the pipeline's own feature assembly and the model on the device's recent real events
    (``recent_events``, by default the ring in the state directory the version is unpacked in)."""
    import numpy as np

    from agent.stream import PipelineError
    from engine import Session
    from engine import selftest as selftest_vectors
    from engine.errors import EngineError
    from engine.format import read_package

    started = time.perf_counter()
    try:
        from agent.inference import pipeline_spec
        from agent.llm_api.service import is_llm_package

        if is_llm_package(directory):  # a language model: regenerate its self-test tokens
            from agent.llm_api.health import llm_health_check

            llm_health_check(directory)
            log.info("LLM health check passed in %.1f ms", 1000 * (time.perf_counter() - started))
            return
        from engine.diffusion.package import is_diffusion_package

        if is_diffusion_package(directory):  # an image model: regenerate its 2-step self-test image
            from agent.llm_api.images import diffusion_health_check

            diffusion_health_check(directory)
            log.info("diffusion health check passed in %.1f ms", 1000 * (time.perf_counter() - started))
            return

        spec = pipeline_spec(directory)  # a package whose pipeline is invalid must not go live
        # one thread, as inference.py serves it: the JIT kernels compiled here (into the state
        # directory's cache, so restarts load warm) are then the ones serving runs; a
        # multi-thread session would also compile parallel variants nothing here runs
        session = Session(directory, threads=1)
        package = read_package(directory, verify=False)  # the unpack just verified every byte
        if spec is not None:
            _check_pipeline_fits(spec, package.manifest)
            _replay_recent_events(spec, session, _recent_lines(directory, recent_events))
        selftest = package.manifest.get("metadata", {}).get("selftest")
        if not selftest:
            return
        dtypes = {spec["name"]: spec["dtype"] for spec in package.manifest.get("inputs") or []}
        outputs = session.run(selftest_vectors.feeds(selftest, package.tensors, dtypes))
        for name, tensor in selftest["outputs"].items():
            expected, value = (
                package.tensors[tensor],
                selftest_vectors.observed(selftest, name, outputs[name]),
            )
            if value.shape != expected.shape or not np.allclose(
                value, expected, atol=selftest.get("atol", 1e-4), rtol=selftest.get("rtol", 1e-3)
            ):
                diff = (
                    float(np.max(np.abs(value - expected))) if value.shape == expected.shape else float("inf")
                )
                raise ActivationError(
                    f"self-test output {name!r} differs from the expected one by {diff:.3g}"
                )
    except ActivationError:
        raise
    except PipelineError as exc:
        raise ActivationError(f"the new version's pipeline is invalid: {exc}") from exc
    except EngineError as exc:
        raise ActivationError(f"the new version does not load or run: {exc}") from exc
    except Exception as exc:  # any failure of an untrusted new version is its failure, not the agent's
        raise ActivationError(f"the new version does not load or run: {type(exc).__name__}: {exc}") from exc
    log.info("health check passed in %.1f ms", 1000 * (time.perf_counter() - started))


def _check_pipeline_fits(spec: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The tensor the pipeline assembles must fit the model's inputs (deploy/compat.py)."""
    from deploy.compat import Contract, describe, mismatches, pipeline_inputs

    inputs, outputs = manifest.get("inputs") or [], manifest.get("outputs") or []
    found = mismatches(Contract(pipeline_inputs(spec, inputs), outputs), inputs, outputs)
    if found:
        raise IncompatibleModel(
            f"incompatible: the model does not take what its pipeline feeds: {describe(found)}"
        )


def _recent_lines(directory: Path, recent_events: Path | None) -> list[str]:
    from agent.stream.recent import load, ring_path, state_dir_of

    if recent_events is None:
        state_dir = state_dir_of(directory)
        if state_dir is None:
            return []
        recent_events = ring_path(state_dir)
    return load(recent_events)


def _replay_recent_events(spec: dict[str, Any], session: Any, lines: list[str]) -> None:
    """Run the new pipeline (parse, windows, triggers, features) and model on recent real events."""
    if not lines or not spec.get("features"):
        return
    from agent.stream import Pipeline, engine_infer

    features = spec["features"]
    infer = engine_infer(session, features.get("input") or session.inputs[0].name)
    failures: list[Exception] = []

    def checked(rows):
        try:
            return infer(rows)
        except Exception as exc:  # kept to name it; the pipeline itself only counts failures
            failures.append(exc)
            raise

    replay = Pipeline({**spec, "sinks": []}, infer=checked)
    stats = replay.run(iter(lines))
    if failures:
        raise IncompatibleModel(
            f"incompatible: the model fails on {stats.inference_errors} feature row(s) its pipeline "
            f"assembled from {len(lines)} recent real event(s): {type(failures[0]).__name__}: {failures[0]}"
        )
    log.info("health check replayed %d recent events: %d inferences", len(lines), stats.inferences)


def _arrived_wrong(offer: Offer) -> DownloadError:
    return DownloadError(f"package {offer.package_digest[:12]} arrived with the wrong size or digest")


class PackageRefused(PackageRejected):
    """A validly signed package this device must not run; ``code`` says why."""

    code = "package_refused"


class WrongDeviceClass(PackageRefused):
    code = "wrong_device_class"


class WrongTenant(PackageRefused):
    code = "wrong_tenant"


class NotAssigned(PackageRefused):
    code = "not_assigned"


def package_check(*, device_class: str, organisation_id: str, manifest_sha256: str = "") -> ClaimsCheck:
    """Refuse a package for another device class or organisation, or not the assigned one."""

    def check(verified: VerifiedManifest) -> None:
        claims = verified.claims
        if not claims.matches(device_class):
            raise WrongDeviceClass(
                f"the package is signed for device class {claims.device_class!r}; "
                f"this device is {device_class!r}"
            )
        if claims.organisation != organisation_id:
            raise WrongTenant(
                f"the package is signed for organisation {claims.organisation!r:.40}; "
                f"this device belongs to {organisation_id!r}"
            )
        if manifest_sha256 and verified.manifest_sha256 != manifest_sha256:
            raise NotAssigned(
                f"the package's manifest is {verified.manifest_sha256[:12]}, the assignment names "
                f"{manifest_sha256[:12]}: not the assigned package"
            )

    return check


def _link_target(link: Path) -> str:
    if not link.is_symlink():
        return ""
    return Path(os.readlink(link)).name
