"""Editing a release while it is a draft: the same checks as creating one, audited, revisioned.

Once a release has started its devices may already act on it, so its policy is frozen; only
the state machine's actions change it then (TransitionConflict names why).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from ferry_cloud.events import AuditEventRecorded, FleetChanged, publish
from registry.models import ModelVersion
from registry.services import version_mark_released

from releases.compatibility import require_compatible
from releases.models import Release, ReleaseEvent
from releases.services import (
    InvalidRelease,
    TransitionConflict,
    _refresh_selection,
    _validate,
    describe_target,
)

# The fields a draft may change: everything release_create takes but its door's one-shot flags.
EDITABLE = ("name", "version", "target", "priority", "phases", "gate", "download_only", "window", "salt")


class ReleaseNotDraft(TransitionConflict):
    code = "release_not_draft"


def release_editable_values(release: Release) -> dict[str, Any]:
    """The draft's settings in release_create's terms, for a door to merge a partial change into."""
    return {
        "name": release.name,
        "version": str(release.version_id),
        "target": release.target or {},
        "priority": release.priority,
        "phases": release.phases or [],
        "gate": release.gate or {},
        "download_only": release.download_only,
        "window": release.window or None,
        "salt": release.salt,
    }


def _check_unmoved(release: Release, expected_revision: int | None) -> None:
    if release.state != Release.State.DRAFT:
        raise ReleaseNotDraft(
            f"Release {release.name!r} is {release.state}: only a draft can be edited. "
            "Create a new release (or pause, abort or roll this one back) instead."
        )
    if expected_revision is not None and expected_revision != release.revision:
        raise TransitionConflict(
            f"The release changed since revision {expected_revision}: it is now revision "
            f"{release.revision}. Reload it and try again."
        )


@transaction.atomic
def release_update(
    *,
    release_id,
    changes: dict[str, Any],
    version: ModelVersion | None = None,
    actor=None,
    expected_revision: int | None = None,
    allow_empty: bool = True,
    new_pipeline: bool = False,
) -> Release:
    """Apply ``changes`` (a subset of EDITABLE, already shaped as release_create takes them) to a
    draft. ``version`` is the new version row when ``changes`` names one. Nothing changed: no-op."""
    release = Release.objects.select_for_update().get(pk=release_id)
    _check_unmoved(release, expected_revision)
    before = release_editable_values(release)
    changed = sorted(k for k, v in changes.items() if k in EDITABLE and before.get(k) != v)
    if not changed:
        return release
    replaced_version_id = release.version_id
    if version is not None and "version" in changed:
        if version.model.organisation_id != release.organisation_id:
            raise InvalidRelease("That version belongs to another organisation.")
        if version.status != ModelVersion.Status.READY:
            raise InvalidRelease(
                f"Version {version} is {version.status}; only a converted version can be released."
            )
        release.version = version
    for name in changed:
        if name == "version":
            continue
        value = changes[name]
        setattr(release, name, ({} if value is None else value) if name == "window" else value)
    _validate(release)
    release.revision += 1
    release.save()
    if release.version_id != replaced_version_id:
        _version_released_recount(replaced_version_id)
    selection = _refresh_selection(release)
    if {"version", "target"}.isdisjoint(changed):  # a rename keeps the checks the create passed
        return _audited(release, changed, actor, {})
    if not selection.matching and not allow_empty:
        raise InvalidRelease(
            f"The target ({describe_target(release.target or {})}) has 0 matching devices. "
            'Pass "allow_empty": true to keep it anyway, e.g. for devices that enrol later.'
        )
    override = require_compatible(
        version=release.version, device_ids=list(selection.matching), new_pipeline=new_pipeline
    )
    return _audited(release, changed, actor, override)


def _version_released_recount(version_id) -> None:
    """The version this draft named before the edit: released only while a release still names it.

    ``released`` (set by release_create, kept on ModelVersion) stands for "a release names this
    version": it freezes the version's options and keeps it from deletion. A draft is the only
    release whose version can change, and it never reached a device, so the version it leaves
    is released exactly when some other release names it. Its row is locked first: a release
    being created for it meanwhile sets the flag after this, not before (the last write wins).
    """
    # registry.services has only version_mark_released; this belongs there as its inverse
    # (platform/registry is another helper's), so it writes the flag itself.
    list(ModelVersion.objects.select_for_update().filter(pk=version_id).values_list("pk", flat=True))
    named = Release.objects.filter(version_id=OuterRef("pk"))
    ModelVersion.objects.filter(pk=version_id).update(released=Exists(named))


def _audited(release: Release, changed: list[str], actor, override: dict) -> Release:
    event = ReleaseEvent.objects.create(
        release=release,
        action="edit",
        from_state=release.state,
        to_state=release.state,
        actor=actor,
        from_phase=0,
        to_phase=0,
        reason="edited " + ", ".join(changed),
        details={"changed": changed, **({"override": override} if override else {})},
    )
    publish(AuditEventRecorded(organisation_id=release.organisation_id, event_id=event.pk))
    if "version" in changed:
        version_mark_released(version=release.version)
    publish(FleetChanged(organisation_id=release.organisation_id))
    return release
