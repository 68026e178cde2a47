"""Packages are signed once, at conversion, for a device class and the organisation (the image
role); nothing re-signs them later (rollbacks and pins are signed assignments)."""

from __future__ import annotations

import json
import tarfile

from ferry_cloud.release_key import release_public_key
from registry import storage
from registry.services import conversion_run, package_manifest_sha256

from deploy.package import SignedClaims, read_claims
from deploy.package.digest import bytes_sha256


def _members(artifact) -> dict[str, bytes]:
    with storage.local_copy(artifact.file.name, ".ferry") as path, tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_a_package_is_signed_for_its_organisation_without_counters(org, ready_version):
    with storage.local_copy(ready_version.package.file.name, ".ferry") as path:
        verified = read_claims(path, release_public_key())
    assert verified.claims == SignedClaims(device_class="*", organisation=str(org.pk))
    envelope = json.loads(_members(ready_version.package)["manifest.sig"])
    assert "counter" not in envelope and "rollback" not in envelope
    # what an assignment names: the manifest's digest, read from the archive's head
    manifest = _members(ready_version.package)["manifest.json"]
    assert package_manifest_sha256(artifact=ready_version.package) == bytes_sha256(manifest)
    assert verified.manifest_sha256 == bytes_sha256(manifest)


def test_rerunning_a_conversion_signs_the_same_bytes(ready_version):
    digest = ready_version.package.sha256
    ready_version.job.status = "running"
    ready_version.job.save()
    conversion_run(job_id=ready_version.job.pk)
    ready_version.refresh_from_db()
    assert ready_version.package.sha256 == digest
