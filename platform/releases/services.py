"""Writes for releases: creation and the state machine's transitions (each audited)."""

from __future__ import annotations

from typing import Any

from accounts.models import Organisation
from django.db import transaction
from ferry_cloud.api_errors import Conflict, ServiceError
from registry.models import ModelVersion
from registry.services import version_mark_released

from deploy.errors import PolicyError
from releases.models import Release, ReleaseEvent
from releases.selectors import policy_from_release

State = Release.State

# action -> (states it may start from, state it leads to)
TRANSITIONS: dict[str, tuple[frozenset[str], str]] = {
    "start": (frozenset({State.DRAFT}), State.ACTIVE),
    "pause": (frozenset({State.ACTIVE}), State.PAUSED),
    "resume": (frozenset({State.PAUSED}), State.ACTIVE),
    "abort": (frozenset({State.DRAFT, State.ACTIVE, State.PAUSED}), State.ABORTED),
}


class InvalidRelease(ServiceError):
    code = "invalid_release"


class TransitionConflict(Conflict):
    code = "transition_conflict"


def _check_target(target: dict[str, Any]) -> dict[str, Any]:
    unknown = set(target) - {"labels", "device_ids", "percentage"}
    if unknown:
        raise InvalidRelease(f"Unknown target field(s): {', '.join(sorted(unknown))}.")
    return target


@transaction.atomic
def release_create(
    *,
    organisation: Organisation,
    version: ModelVersion,
    name: str,
    target: dict[str, Any],
    priority: int = 0,
    actor=None,
    start: bool = False,
) -> Release:
    if version.model.organisation_id != organisation.pk:
        raise InvalidRelease("That version belongs to another organisation.")
    if version.status != ModelVersion.Status.READY:
        raise InvalidRelease(
            f"Version {version} is {version.status}; only a converted version can be released."
        )
    release = Release(
        organisation=organisation,
        version=version,
        name=name,
        target=_check_target(target),
        priority=priority,
        created_by=actor,
    )
    try:
        policy_from_release(release)
    except (PolicyError, TypeError, ValueError) as exc:
        raise InvalidRelease(f"Invalid target: {exc}") from None
    release.save()
    ReleaseEvent.objects.create(
        release=release, action="create", from_state="", to_state=release.state, actor=actor
    )
    version_mark_released(version=version)
    if start:
        release = release_transition(
            release_id=release.pk, action="start", actor=actor, reason="created started"
        )
    return release


@transaction.atomic
def release_transition(*, release_id, action: str, actor=None, reason: str = "") -> Release:
    """Apply one action; repeating an action that already took effect is a no-op.

    The row lock makes concurrent transitions serial: the first wins, the second sees
    the new state and either is a repeat (no-op) or gets a TransitionConflict.
    """
    if action not in TRANSITIONS:
        raise InvalidRelease(f"Unknown action {action!r}; use one of {', '.join(TRANSITIONS)}.")
    release = Release.objects.select_for_update().get(pk=release_id)
    sources, destination = TRANSITIONS[action]
    if release.state == destination:
        return release
    if release.state not in sources:
        raise TransitionConflict(f"Cannot {action} a release that is {release.state}.")
    ReleaseEvent.objects.create(
        release=release,
        action=action,
        from_state=release.state,
        to_state=destination,
        actor=actor,
        reason=reason,
    )
    release.state = destination
    release.save(update_fields=["state", "updated_at"])
    return release
