"""Reads for releases, and the bridge from rows to deploy/'s plain policies."""

from __future__ import annotations

from accounts.models import Organisation
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from ferry_cloud.api_errors import NotFound
from fleet.models import Device

from deploy.rollout import DeviceFacts, ReleasePolicy, Target, desired_release
from releases.models import Release


def policy_from_release(release: Release) -> ReleasePolicy:
    target = release.target or {}
    return ReleasePolicy(
        release_id=str(release.pk),
        organisation_id=str(release.organisation_id),
        version_id=str(release.version_id),
        package_digest=release.version.package.sha256 if release.version.package_id else "",
        salt=release.salt,
        target=Target(
            device_ids=frozenset(str(d) for d in target.get("device_ids", [])),
            labels={str(k): str(v) for k, v in target.get("labels", {}).items()},
            percentage=float(target.get("percentage", 100.0)),
        ),
        priority=release.priority,
        created_at=release.created_at.timestamp() if release.created_at else 0.0,
    )


def release_list(*, organisation: Organisation) -> QuerySet[Release]:
    return Release.objects.filter(organisation=organisation).select_related(
        "version__model", "version__package"
    )


def release_get(*, organisation: Organisation, release_id) -> Release:
    try:
        return release_list(organisation=organisation).get(pk=release_id)
    except (Release.DoesNotExist, ValueError, ValidationError):
        raise NotFound(f"No release {release_id} in this organisation.") from None


def active_policies(*, organisation_id) -> list[ReleasePolicy]:
    releases = Release.objects.filter(
        organisation_id=organisation_id, state=Release.State.ACTIVE, version__package__isnull=False
    ).select_related("version__package")
    return [policy_from_release(r) for r in releases]


def device_facts(device: Device) -> DeviceFacts:
    return DeviceFacts(
        device_id=str(device.pk),
        organisation_id=str(device.organisation_id),
        attributes={str(k): str(v) for k, v in (device.attributes or {}).items()},
        labels={str(k): str(v) for k, v in (device.labels or {}).items()},
    )


def desired_release_for(device: Device) -> Release | None:
    policy = desired_release(device_facts(device), active_policies(organisation_id=device.organisation_id))
    if policy is None:
        return None
    return Release.objects.select_related("version__model", "version__package").get(pk=policy.release_id)
