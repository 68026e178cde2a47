"""REST doors onto release services."""

from __future__ import annotations

from accounts.api import OrganisationApi
from accounts.permissions import OperatorWrites, ReadOnly
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from ferry_cloud.api_conditions import IF_MATCH, created, require_match, tagged
from ferry_cloud.api_lists import ListQuery, list_query, page_of, paginated
from ferry_cloud.api_shapes import StrictSerializer, VersionRefOutput, version_ref
from ferry_cloud.errors import Invalid
from ferry_cloud.events import EVENT_TYPES, event_type
from ferry_cloud.idempotency import HEADER as IDEMPOTENCY_KEY
from ferry_cloud.idempotency import idempotent
from registry.selectors import version_get
from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response

from deploy.phases import ACTIONS
from deploy.windows import MAX_DURATION_SECONDS
from releases import drafts, selectors, services
from releases.models import DeviceReleaseStatus, Release, ReleaseEvent
from releases.status_counts import (
    REPORTED_ONLY_STATES,
    release_device_statuses_in,
    release_device_summary,
)

# Integers are range-checked where they land: the database column holds 32 bits.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class EventOutput(serializers.ModelSerializer):
    actor = serializers.CharField(
        source="actor.username",
        default=None,
        allow_null=True,
        help_text="null: the system (the health gate).",
    )
    from_phase = serializers.SerializerMethodField()
    to_phase = serializers.SerializerMethodField()
    type = serializers.SerializerMethodField(
        help_text="What happened, for webhooks and streams: release.completed, device.refused, ..."
    )

    class Meta:
        model = ReleaseEvent
        fields = [
            "id",
            "type",
            "action",
            "from_state",
            "to_state",
            "from_phase",
            "to_phase",
            "actor",
            "reason",
            "details",
            "at",
        ]

    def get_type(self, obj: ReleaseEvent) -> str:
        return event_type(obj.action, obj.to_state)

    def get_from_phase(self, obj: ReleaseEvent) -> int | None:
        return None if obj.from_phase is None else obj.from_phase + 1

    def get_to_phase(self, obj: ReleaseEvent) -> int | None:
        return None if obj.to_phase is None else obj.to_phase + 1


class ReleaseOutput(serializers.ModelSerializer):
    version = serializers.UUIDField(
        source="version_id", read_only=True, help_text="The version id, as on input."
    )
    version_info = serializers.SerializerMethodField()
    phase = serializers.SerializerMethodField(help_text="The current phase, 1-based.")
    phases = serializers.SerializerMethodField(
        help_text="The phases in effect (one implicit phase if none given)."
    )
    percentage = serializers.SerializerMethodField(
        help_text="The current phase's percentage of matching devices."
    )
    devices = serializers.SerializerMethodField(
        help_text="Devices on the release's version and on others, and how many its target matches."
    )
    events = EventOutput(many=True)

    class Meta:
        model = Release
        fields = [
            "id",
            "name",
            "state",
            "revision",
            "version",
            "version_info",
            "target",
            "priority",
            "salt",
            "phase",
            "phases",
            "percentage",
            "phase_started_at",
            "gate",
            "gate_status",
            "download_only",
            "window",
            "devices",
            "created_at",
            "events",
        ]

    @extend_schema_field(VersionRefOutput)
    def get_version_info(self, obj: Release) -> dict:
        return version_ref(obj.version)

    def get_phase(self, obj: Release) -> int:
        return obj.current_phase + 1

    def get_phases(self, obj: Release) -> list[dict]:
        return [p.as_dict() for p in selectors.release_phases(obj)]

    @extend_schema_field(
        {
            "type": "object",
            "properties": {
                "by_state": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                    "description": "Devices per status with this release (the detail answer only).",
                }
            },
            "additionalProperties": {"type": ["integer", "object"]},
        }
    )
    def get_devices(self, obj: Release) -> dict:
        if "spread" not in self.context:  # one query per answer, however many releases it lists
            self.context["spread"] = selectors.fleet_version_spread(organisation_id=obj.organisation_id)
        counts = selectors.release_device_counts(release=obj, spread=self.context["spread"])
        # the target's live matching devices, as of the last start, advance or gate evaluation
        devices = {**counts, "matching": obj.matching_devices}
        if self.context.get("detail"):  # per-device states cost a selection: the detail view only
            devices["by_state"] = release_device_summary(release=obj)
        return devices

    def get_percentage(self, obj: Release) -> float:
        return selectors.release_phases(obj)[obj.current_phase].percentage


class TargetInput(StrictSerializer):
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False)
    device_ids = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=100_000)
    group_ids = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=1000)
    filter = serializers.CharField(required=False, allow_blank=True, max_length=4000, trim_whitespace=False)
    percentage = serializers.FloatField(min_value=0.0, max_value=100.0, required=False)


class PhaseInput(StrictSerializer):
    percentage = serializers.FloatField(min_value=0.0, max_value=100.0)
    min_soak_seconds = serializers.IntegerField(min_value=0, max_value=INT32_MAX, required=False, default=0)
    min_reporting_devices = serializers.IntegerField(
        min_value=0, max_value=INT32_MAX, required=False, default=0
    )
    manual_approval = serializers.BooleanField(required=False, default=False)


class GateInput(StrictSerializer):
    max_activation_failure_rate = serializers.FloatField(min_value=0, required=False, allow_null=True)
    max_error_rate = serializers.FloatField(min_value=0, required=False, allow_null=True)
    max_latency_p95_ratio = serializers.FloatField(min_value=0, required=False, allow_null=True)
    max_restarts_per_device = serializers.FloatField(min_value=0, required=False, allow_null=True)
    max_drift = serializers.FloatField(min_value=0, max_value=1, required=False, allow_null=True)
    on_failure = serializers.ChoiceField(choices=["pause", "abort"], required=False)


class WindowInput(StrictSerializer):
    cron = serializers.CharField(max_length=100)
    duration_seconds = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_SECONDS)
    timezone = serializers.CharField(max_length=64, required=False, default="UTC")


class ReleaseInput(StrictSerializer):
    name = serializers.CharField(max_length=200)
    version = serializers.UUIDField()
    target = TargetInput(required=False, default=dict)
    priority = serializers.IntegerField(min_value=INT32_MIN, max_value=INT32_MAX, required=False, default=0)
    phases = PhaseInput(many=True, required=False, default=list)
    gate = GateInput(required=False, default=dict)
    download_only = serializers.BooleanField(required=False, default=False)
    window = WindowInput(required=False, allow_null=True, default=None)
    salt = serializers.RegexField(
        r"^[A-Za-z0-9_-]{1,32}$",
        required=False,
        help_text="Bucketing salt; reuse another release's to keep the same devices first. Default: random.",
    )
    start = serializers.BooleanField(required=False, default=False)
    allow_empty = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Create the release even if its target matches 0 devices now (devices that enrol later).",
    )
    new_pipeline = serializers.BooleanField(
        required=False,
        default=False,
        help_text="The release ships a new pipeline: skip the check that the version fits what devices feed.",
    )


class ActionInput(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")
    expected_revision = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=INT32_MAX,
        help_text="The revision you saw; 409 if the release moved since.",
    )
    phase = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        help_text="advance only: the phase to leave (makes advance idempotent).",
    )


def release_etag(release: Release) -> str:
    """A release's ETag names its revision (state, phase, settings), not its live device counts,
    so a read-decide-act script is refused only when the release itself moved."""
    return f'"{release.pk}-r{release.revision}"'


def _plain(data):
    """Serializer output (OrderedDicts, UUIDs) as JSON-ready values for the model's JSON fields."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return str(data) if data.__class__.__name__ == "UUID" else data


class ReleaseQuery(ListQuery):
    ORDERING = ("-created_at", "created_at", "name", "-name")
    LIST_PARAMETERS = frozenset({"state"})

    state = serializers.MultipleChoiceField(
        choices=Release.State.choices, required=False, help_text="Any of these states (repeat the parameter)."
    )
    version = serializers.UUIDField(required=False, help_text="Releases of this version.")


class ReleaseListCreateApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(
        parameters=[ReleaseQuery],
        responses=page_of(ReleaseOutput, "ReleasePage"),
        operation_id="v1_releases_list",
    )
    def get(self, request):
        query = list_query(ReleaseQuery, request)
        releases = selectors.release_list_filtered(
            organisation=self.organisation,
            states=sorted(query.get("state", ())),
            version_id=query.get("version"),
        ).prefetch_related("events__actor")
        return paginated(request, releases, query, lambda rows: ReleaseOutput(rows, many=True).data)

    @extend_schema(request=ReleaseInput, responses={201: ReleaseOutput}, parameters=[IDEMPOTENCY_KEY])
    @idempotent
    def post(self, request):
        data = ReleaseInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = _plain(data.validated_data)
        release = services.release_create(
            organisation=self.organisation,
            version=version_get(organisation=self.organisation, version_id=values["version"]),
            name=values["name"],
            target=values["target"],
            priority=values["priority"],
            phases=values["phases"],
            gate=values["gate"],
            download_only=values["download_only"],
            window=values["window"],
            salt=values.get("salt"),
            actor=request.user,
            start=values["start"],
            allow_empty=values["allow_empty"],
            new_pipeline=values["new_pipeline"],
        )
        release = selectors.release_get(organisation=self.organisation, release_id=release.pk)
        response = created(request, ReleaseOutput(release).data, "release", release_id=release.pk)
        return tagged(response, release_etag(release))


class ReleaseEditInput(ReleaseInput):
    """A draft's change: any of the create's fields (checked as on create), none required."""

    start = None  # starting is an action (POST .../start/), not an edit
    expected_revision = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=INT32_MAX,
        help_text="The revision you saw; 409 if the release moved since.",
    )


def _edit_values(release: Release, patch: dict) -> tuple[dict, dict]:
    """The patch validated exactly as a create of the merged release would be, and its flags."""
    if not isinstance(patch, dict):
        raise Invalid("The body must be a JSON object of the fields to change.")
    merged = ReleaseEditInput(data={**drafts.release_editable_values(release), **patch})
    merged.is_valid(raise_exception=True)
    values = _plain(merged.validated_data)
    flags = {k: values.pop(k) for k in ("allow_empty", "new_pipeline")}
    flags["expected_revision"] = values.pop("expected_revision", None)
    return {k: v for k, v in values.items() if k in patch}, flags


class ReleaseDetailApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(responses=ReleaseOutput)
    def get(self, request, release_id):
        release = selectors.release_get(
            organisation=self.organisation, release_id=release_id, with_events=True
        )
        return tagged(Response(ReleaseOutput(release, context={"detail": True}).data), release_etag(release))

    @extend_schema(request=ReleaseEditInput, responses=ReleaseOutput, parameters=[IF_MATCH])
    def patch(self, request, release_id):
        """Edit a draft (409 release_not_draft once it started); validated as a create would be."""
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        require_match(request, None, tag=release_etag(release))
        changes, flags = _edit_values(release, request.data)
        version = None
        if "version" in changes:
            version = version_get(organisation=self.organisation, version_id=changes["version"])
        drafts.release_update(
            release_id=release.pk, changes=changes, version=version, actor=request.user, **flags
        )
        release = selectors.release_get(organisation=self.organisation, release_id=release.pk)
        return tagged(Response(ReleaseOutput(release, context={"detail": True}).data), release_etag(release))


class DeviceStatusOutput(serializers.Serializer):
    device_id = serializers.CharField()
    device_name = serializers.CharField()
    state = serializers.ChoiceField(choices=DeviceReleaseStatus.State.choices)
    reason_code = serializers.CharField(help_text="Machine-readable: verification, device_class, ...")
    message = serializers.CharField(help_text="The device's own words, at most 500 characters.")
    assignment_counter = serializers.IntegerField()
    reported_at = serializers.DateTimeField(allow_null=True, help_text="When the device entered the state.")
    updated_at = serializers.DateTimeField(
        allow_null=True, help_text="When the control plane last heard a change."
    )


class InvalidStateFilter(Invalid):
    code = "invalid_filter"


class ReleaseDevicesApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(responses=DeviceStatusOutput(many=True))
    def get(self, request, release_id):
        """Each device's status with this release (pending: selected, no report yet); ?state= filters."""
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        state = request.query_params.get("state") or None
        if state is not None and state not in DeviceReleaseStatus.State.values:
            raise InvalidStateFilter(
                f"Unknown state {state[:40]!r}; use one of {', '.join(DeviceReleaseStatus.State.values)}.",
                fields={"state": ["unknown state"]},
            )
        if state in REPORTED_ONLY_STATES:  # stored reports only: paged in the database
            rows = release_device_statuses_in(release=release, state=state)
        else:
            rows = selectors.release_device_statuses(release=release, state=state)
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(DeviceStatusOutput(page, many=True).data)


class ReleaseActionApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(
        request=ActionInput,
        responses=ReleaseOutput,
        operation_id="v1_releases_action",
        parameters=[
            IF_MATCH,
            OpenApiParameter("action", str, OpenApiParameter.PATH, enum=[*ACTIONS, *services.EXTRA_ACTIONS]),
        ],
    )
    def post(self, request, release_id, action: str):
        """start, pause, resume, advance, abort, rollback or activate (download-only releases)."""
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        require_match(request, None, tag=release_etag(release))
        data = ActionInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.release_transition(
            release_id=release.pk,
            action=action,
            actor=request.user,
            reason=data.validated_data["reason"],
            expected_revision=data.validated_data.get("expected_revision"),
            phase=data.validated_data.get("phase"),
        )
        release = selectors.release_get(organisation=self.organisation, release_id=release.pk)
        return tagged(Response(ReleaseOutput(release).data), release_etag(release))


class GateStatusOutput(serializers.Serializer):
    step = serializers.CharField()
    reason = serializers.CharField()
    passed = serializers.BooleanField(required=False)
    failures = serializers.ListField(child=serializers.CharField(), required=False)
    figures = serializers.DictField(required=False)


class ReleaseGateApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(request=None, responses=GateStatusOutput)
    def post(self, request, release_id):
        """Evaluate the release's health gate now and act on it, as the periodic task does."""
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        return Response(services.release_gate_evaluate(release_id=release.pk))


# ---- events: one release's, and the organisation's audit feed ---------------------------------


class AuditEventOutput(EventOutput):
    release = serializers.UUIDField(
        source="release_id", allow_null=True, help_text="null: no release's event (a bulk device action)."
    )
    release_name = serializers.CharField(source="release.name", default=None, allow_null=True)

    class Meta(EventOutput.Meta):
        fields = ["id", "release", "release_name", *EventOutput.Meta.fields]


class EventQuery(ListQuery):
    ORDERING = ("at", "-at")
    LIST_PARAMETERS = frozenset({"type"})

    type = serializers.MultipleChoiceField(
        choices=sorted(EVENT_TYPES), required=False, help_text="Any of these event types (repeat it)."
    )
    actor = serializers.CharField(
        required=False, allow_blank=True, max_length=150, help_text="A username; empty: the system's own."
    )
    after = serializers.DateTimeField(required=False, help_text="Events at or after this time.")
    before = serializers.DateTimeField(required=False, help_text="Events before this time.")


class AuditQuery(EventQuery):
    ORDERING = ("-at", "at")

    release = serializers.UUIDField(required=False, help_text="One release's events.")


def _events_page(request, organisation, query: dict, release_id=None):
    events = selectors.release_events(
        organisation=organisation,
        release_id=release_id if release_id is not None else query.get("release"),
        actor=query.get("actor"),
        after=query.get("after"),
        before=query.get("before"),
        types=sorted(query.get("type", ())),
    )
    return paginated(request, events, query, lambda rows: AuditEventOutput(rows, many=True).data)


class ReleaseEventsApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(
        parameters=[EventQuery],
        responses=page_of(AuditEventOutput, "ReleaseEventPage"),
        operation_id="v1_release_events_list",
    )
    def get(self, request, release_id):
        """The release's events, oldest first: every state change, who made it and why."""
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        return _events_page(request, self.organisation, list_query(EventQuery, request), release.pk)


class AuditFeedApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(
        parameters=[AuditQuery],
        responses=page_of(AuditEventOutput, "AuditEventPage"),
        operation_id="v1_audit_list",
    )
    def get(self, request):
        """The organisation's audit feed, newest first: every release state change, who made it and why."""
        return _events_page(request, self.organisation, list_query(AuditQuery, request))
