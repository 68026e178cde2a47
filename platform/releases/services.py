"""Writes for releases: creation, the state machine's transitions (each audited) and the
periodic health-gate evaluation that advances, pauses or aborts releases."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

from accounts.models import Organisation
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from ferry_cloud.errors import Conflict, Invalid
from ferry_cloud.events import AuditEventRecorded, FleetChanged, publish
from registry.models import ModelVersion
from registry.services import version_mark_released
from telemetry.selectors import first_report_at, release_gate_telemetry

from deploy.errors import PolicyError
from deploy.gates import GateThresholds, evaluate_gate, refusal_failure
from deploy.phases import (
    ACTIONS,
    RolloutState,
    Status,
    Step,
    StepDecision,
    TransitionRefused,
    next_step,
    transition,
)
from releases.compatibility import require_compatible
from releases.models import Release, ReleaseEvent
from releases.selectors import (
    Selection,
    organisation_groups,
    pinned_away,
    policy_from_release,
    release_device_failures,
    release_phases,
    release_selection,
    release_unsettled_devices,
)
from releases.status_counts import release_split_keep

log = logging.getLogger(__name__)
State = Release.State
# the telemetry a gate looks at: since the phase started, at most this far back
GATE_LOOKBACK = timedelta(minutes=15)
EXTRA_ACTIONS = ("activate",)  # download-only release: let its devices switch to the version now


class InvalidRelease(Invalid):
    code = "invalid_release"


class TransitionConflict(Conflict):
    code = "transition_conflict"


def _validate(release: Release) -> None:
    """Every policy field, through the same deploy/ code that will read it on each check-in."""
    try:
        if release.phases and "percentage" in (release.target or {}):
            raise PolicyError("give the percentage in the phases or in the target, not both")
        GateThresholds.from_dict(release.gate)
        policy_from_release(release, organisation_groups(organisation_id=release.organisation_id))
    except (PolicyError, TypeError, ValueError) as exc:
        raise InvalidRelease(f"Invalid release: {exc}") from None


def describe_target(target: dict[str, Any]) -> str:
    """The target's parts in words, for messages: which filter matched nothing."""
    parts = []
    if target.get("filter"):
        parts.append(f"filter {target['filter']!r}")
    if target.get("labels"):
        parts.append("labels " + ", ".join(f"{k}={v}" for k, v in sorted(target["labels"].items())))
    if target.get("group_ids"):
        parts.append(f"group(s) {', '.join(str(g) for g in target['group_ids'])}")
    if target.get("device_ids"):
        parts.append(f"{len(target['device_ids'])} listed device id(s)")
    return " and ".join(parts) or "the whole fleet"


def _refresh_selection(release: Release) -> Selection:
    """Recompute the current phase's threshold from the matching devices now and store it, so
    each check-in only compares a bucket with it (see deploy/rollout.py)."""
    selection = release_selection(release)
    release.bucket_threshold = selection.threshold
    release.threshold_phase = release.current_phase
    release.matching_devices = len(selection.matching)
    Release.objects.filter(pk=release.pk).update(
        bucket_threshold=release.bucket_threshold,
        threshold_phase=release.threshold_phase,
        matching_devices=release.matching_devices,
    )
    return selection


@transaction.atomic
def release_create(
    *,
    organisation: Organisation,
    version: ModelVersion,
    name: str,
    target: dict[str, Any],
    priority: int = 0,
    phases: list[dict] | None = None,
    gate: dict | None = None,
    download_only: bool = False,
    window: dict | None = None,
    salt: str | None = None,
    actor=None,
    start: bool = False,
    allow_empty: bool = True,
    new_pipeline: bool = False,
) -> Release:
    """Create (and optionally start) a release.

    ``allow_empty=False`` (the REST API's default) refuses a target that matches no device
    now; pass True for a target meant for devices that enrol later (e.g. a dynamic group).
    A version whose signature does not fit what the targeted devices run now is refused
    (IncompatibleVersion) unless ``new_pipeline`` says the release ships what feeds it.
    """
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
        target=target,
        priority=priority,
        phases=phases or [],
        gate=gate or {},
        download_only=download_only,
        window=window or {},
        created_by=actor,
    )
    if salt:
        release.salt = salt
    _validate(release)
    release.save()
    selection = _refresh_selection(release)
    if not selection.matching and not allow_empty:
        raise InvalidRelease(
            f"The target ({describe_target(release.target or {})}) has 0 matching devices. "
            'Pass "allow_empty": true to create it anyway, e.g. for devices that enrol later.'
        )
    override = require_compatible(
        version=version, device_ids=list(selection.matching), new_pipeline=new_pipeline
    )
    event = ReleaseEvent.objects.create(
        release=release,
        action="create",
        from_state="",
        to_state=release.state,
        actor=actor,
        from_phase=0,
        to_phase=0,
        reason="ships a new pipeline: the version does not fit what its devices run now" if override else "",
        details=override,
    )
    publish(AuditEventRecorded(organisation_id=release.organisation_id, event_id=event.pk))
    version_mark_released(version=version)
    if start:
        release = release_transition(
            release_id=release.pk, action="start", actor=actor, reason="created started"
        )
    return release


@transaction.atomic
def release_transition(
    *,
    release_id,
    action: str,
    actor=None,
    reason: str = "",
    expected_revision: int | None = None,
    phase: int | None = None,
    details: dict | None = None,
) -> Release:
    """Apply one action; repeating an action that already took effect is a no-op.

    The row lock makes concurrent transitions serial. A caller that passes the revision it
    saw (the console always does) gets a TransitionConflict when someone else moved the
    release first, so of two concurrent people exactly one wins. ``phase`` (1-based, for
    advance) names the phase to leave, which makes advancing idempotent too.
    """
    if action not in ACTIONS + EXTRA_ACTIONS:
        raise InvalidRelease(f"Unknown action {action!r}; use one of {', '.join(ACTIONS + EXTRA_ACTIONS)}.")
    release = Release.objects.select_for_update().get(pk=release_id)
    if action == "activate":
        return _activate(release, actor=actor, reason=reason, expected_revision=expected_revision)
    phases = release_phases(release)
    before = RolloutState(Status(release.state), release.current_phase)
    try:
        after = transition(before, action, len(phases), None if phase is None else phase - 1)
    except TransitionRefused as exc:
        raise TransitionConflict(str(exc)) from None
    if after == before:
        return release  # already in effect: idempotent
    if after.status == Status.COMPLETED and not release_selection(release).matching:
        raise TransitionConflict(
            "Cannot complete a release with 0 matching devices: it stays active until devices match "
            f"its target ({describe_target(release.target or {})})."
        )
    if expected_revision is not None and expected_revision != release.revision:
        last = release.events.order_by("-at", "-id").first()
        who = f" ({last.action} by {last.actor or 'the health gate'})" if last else ""
        raise TransitionConflict(
            f"The release changed since revision {expected_revision}: it is now revision {release.revision}, "
            f"{release.state}{who}. Reload it and try again."
        )
    event = ReleaseEvent.objects.create(
        release=release,
        action=action,
        from_state=before.status,
        to_state=after.status,
        from_phase=before.phase,
        to_phase=after.phase,
        actor=actor,
        reason=reason,
        details=details or {},
    )
    publish(AuditEventRecorded(organisation_id=release.organisation_id, event_id=event.pk))
    release.state = after.status.value
    release.revision += 1
    fields = ["state", "revision", "updated_at"]
    if after.phase != before.phase or (action == "start" and release.phase_started_at is None):
        release.current_phase = after.phase
        release.phase_started_at = timezone.now()
        fields += ["current_phase", "phase_started_at"]
    if action == "resume":  # a paused phase soaks again before the gate may advance it
        release.phase_started_at = timezone.now()
        fields.append("phase_started_at")
    if "phase_started_at" in fields:  # the new soak clock starts at the phase's first report
        release.phase_reporting_since = None
        fields.append("phase_reporting_since")
    release.save(update_fields=sorted(set(fields)))
    if after.status in (Status.ACTIVE, Status.PAUSED):
        _refresh_selection(release)
    publish(FleetChanged(organisation_id=release.organisation_id))
    return release


def _activate(release: Release, *, actor, reason: str, expected_revision: int | None) -> Release:
    if not release.download_only:
        return release
    if expected_revision is not None and expected_revision != release.revision:
        raise TransitionConflict(
            f"The release changed since revision {expected_revision}: it is now revision {release.revision}."
        )
    if release.state in (State.ABORTED, State.ROLLED_BACK):
        raise TransitionConflict(f"Cannot activate a release that is {release.state}.")
    event = ReleaseEvent.objects.create(
        release=release,
        action="activate",
        from_state=release.state,
        to_state=release.state,
        from_phase=release.current_phase,
        to_phase=release.current_phase,
        actor=actor,
        reason=reason,
    )
    publish(AuditEventRecorded(organisation_id=release.organisation_id, event_id=event.pk))
    release.download_only = False
    release.revision += 1
    release.save(update_fields=["download_only", "revision", "updated_at"])
    publish(FleetChanged(organisation_id=release.organisation_id))
    return release


# --- health gates -----------------------------------------------------------------------------

STEP_ACTIONS = {Step.ADVANCE: "advance", Step.COMPLETE: "advance", Step.PAUSE: "pause", Step.ABORT: "abort"}


# Kinds whose telemetry measures the same thing: `latency` is one inference for a model, the
# time to first token for a chat (base or adapter), a whole image for a diffusion pipeline.
COMPARABLE_KINDS = {
    ModelVersion.Kind.ONNX: (ModelVersion.Kind.ONNX,),
    ModelVersion.Kind.LLM: (ModelVersion.Kind.LLM, ModelVersion.Kind.LLM_ADAPTER),
    ModelVersion.Kind.LLM_ADAPTER: (ModelVersion.Kind.LLM, ModelVersion.Kind.LLM_ADAPTER),
    ModelVersion.Kind.DIFFUSION: (ModelVersion.Kind.DIFFUSION,),
}


def comparable_version_ids(version: ModelVersion, *, versions: dict[str, set[str]] | None = None) -> set[str]:
    """The organisation's versions whose devices can be the gate's baseline for ``version``:
    those of a kind whose figures mean the same (a first LLM release onto a fleet of
    classifiers has no baseline, so its latency ratio waits instead of failing). ``versions``:
    the organisation's {kind: version ids}, read once for a whole gate tick (else read here)."""
    if versions is None:
        versions = organisation_versions_by_kind([version.model.organisation_id]).get(
            version.model.organisation_id, {}
        )
    kinds = COMPARABLE_KINDS.get(version.kind, (version.kind,))
    return set().union(*(versions.get(kind, set()) for kind in kinds))


def organisation_versions_by_kind(organisation_ids) -> dict[int, dict[str, set[str]]]:
    """{organisation id: {kind: version ids}} of these organisations: one query."""
    rows = ModelVersion.objects.filter(model__organisation_id__in=organisation_ids).values_list(
        "model__organisation_id", "kind", "pk"
    )
    found: dict[int, dict[str, set[str]]] = {}
    for organisation_id, kind, pk in rows:
        found.setdefault(organisation_id, {}).setdefault(kind, set()).add(str(pk))
    return found


def release_gate_evaluate(*, release_id, now=None, versions: dict[str, set[str]] | None = None) -> dict:
    """Evaluate an active release's gate once and act on it (advance, complete, pause, abort).
    ``versions``: see comparable_version_ids.

    Idempotent: the action names the phase it leaves and the revision it saw, so a second
    worker evaluating the same release at the same time changes nothing twice.
    """
    now = now or timezone.now()
    release = Release.objects.select_related("version__model").get(pk=release_id)
    if release.state != State.ACTIVE:
        return {"step": "wait", "reason": f"release is {release.state}"}
    phases = release_phases(release)
    thresholds = GateThresholds.from_dict(release.gate)
    selection = _refresh_selection(release)  # devices that enrolled or changed since join here
    release_split_keep(release=release, selection=selection)  # the detail's, so no request computes it
    # a device pinned to another version is not the release's: none of its figures count, in
    # the cohort or in the baseline (the release's population still on another version)
    away = pinned_away(release, set(selection.matching))
    cohort = selection.selected - away
    started = release.phase_started_at or release.updated_at
    reporting_since = _phase_reporting_since(release, cohort, started)
    since = max(started, now - GATE_LOOKBACK)
    telemetry = release_gate_telemetry(
        organisation_id=release.organisation_id,
        version_id=str(release.version_id),
        since=since,
        device_ids=set(cohort),
        baseline_ids=set(selection.matching) - away,
        baseline_version_ids=comparable_version_ids(release.version, versions=versions),
    )
    treated = _with_refusals(release, cohort, telemetry.treated, telemetry.failed_activations)
    baseline = telemetry.baseline
    result = evaluate_gate(thresholds, treated, baseline)
    result.figures.update(
        devices_matching=len(selection.matching),
        devices_selected=len(selection.selected),
        devices_pinned_away=len(away & selection.selected),
        phase_reporting_since=reporting_since.isoformat() if reporting_since else None,
    )
    if result.passed and release.current_phase + 1 >= len(phases):  # completion is in sight
        online_since = now - timedelta(seconds=settings.FERRY_DEVICE_ONLINE_SECONDS)
        unsettled = release_unsettled_devices(release=release, device_ids=cohort, online_since=online_since)
        result.figures["devices_unsettled"] = len(unsettled)
    soaked = (now - reporting_since).total_seconds() if reporting_since else 0.0
    state = RolloutState(Status(release.state), release.current_phase)
    decision = next_step(phases, state, soaked, result, thresholds.on_failure)
    if treated.devices_refused:  # a device said it cannot run the release: waiting cannot help
        decision = StepDecision(Step.ABORT, "health gate failed: " + refusal_failure(treated))
    status = {
        "step": decision.step.value,
        "reason": decision.reason,
        "phase": release.current_phase + 1,
        "evaluated_at": now.isoformat(),
        **result.as_dict(),
    }
    Release.objects.filter(pk=release.pk).update(gate_status=status)
    action = STEP_ACTIONS.get(decision.step)
    if action:
        try:
            release_transition(
                release_id=release.pk,
                action=action,
                reason=decision.reason,
                expected_revision=release.revision,
                phase=release.current_phase + 1 if action == "advance" else None,
                details=status,
            )
        except TransitionConflict as exc:  # a person acted meanwhile: theirs stands
            log.info("gate of release %s: %s", release.pk, exc)
    return status


def _with_refusals(release: Release, cohort: frozenset[str], figures, failed_activations: dict[str, str]):
    """The cohort's figures with the cohort's devices that refused, failed or rolled back the
    release: failures, no longer pending. Either channel counts, the update status a check-in
    carries or the activation record telemetry carries (``failed_activations``, read with the
    cohort's figures), whichever arrives first, so the gate's decision (abort: a refusal is
    evidence enough) does not depend on their order."""
    failed = release_device_failures(release=release, device_ids=cohort)
    for device, code in failed_activations.items():
        failed.setdefault(device, code)
    if not failed:
        return figures
    return replace(
        figures,
        devices_refused=len(failed),
        refusal_reasons=dict(Counter(failed.values())),
        devices_pending=max(0, figures.devices_pending - len(failed)),
    )


def _phase_reporting_since(release: Release, cohort: frozenset[str], started):
    """The first report of a device of the phase's cohort, found once and kept on the release."""
    if release.phase_reporting_since is not None:
        return release.phase_reporting_since
    first = first_report_at(device_ids=cohort, version_id=str(release.version_id), since=started)
    if first is not None:
        Release.objects.filter(pk=release.pk, phase_reporting_since__isnull=True).update(
            phase_reporting_since=first
        )
    return first


def release_gates_evaluate_all() -> list[dict]:
    """The periodic task's body: every active release, each in isolation.

    Whatever goes wrong with one release (a malformed policy, a bug, bad data) is logged and
    recorded in that release's gate_status; the loop goes on with the others, of every tenant.
    """
    results = []
    active = list(Release.objects.filter(state=State.ACTIVE).values_list("pk", "organisation_id"))
    versions = organisation_versions_by_kind({organisation_id for _, organisation_id in active})
    for release_id, organisation_id in active:
        try:
            with transaction.atomic():  # a savepoint: a failed query cannot poison the next release
                status = release_gate_evaluate(
                    release_id=release_id, versions=versions.get(organisation_id, {})
                )
            results.append({"release": str(release_id), **status})
        except Release.DoesNotExist:
            continue  # deleted meanwhile
        except Exception as exc:  # noqa: BLE001 - one release's failure must not stop the others
            log.exception("could not evaluate the gate of release %s", release_id)
            _record_gate_error(release_id, exc)
    return results


def _record_gate_error(release_id, exc: Exception) -> None:
    status = {
        "step": "error",
        "reason": f"gate evaluation failed: {type(exc).__name__}: {exc}"[:500],
        "evaluated_at": timezone.now().isoformat(),
    }
    try:
        Release.objects.filter(pk=release_id).update(gate_status=status)
    except Exception:  # noqa: BLE001 - the database itself failed: the log above has it
        log.exception("could not record the gate error of release %s", release_id)
