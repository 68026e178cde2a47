"""REST doors onto release services."""

from __future__ import annotations

from accounts.api import OrganisationApi
from accounts.permissions import OperatorWrites, ReadOnly
from drf_spectacular.utils import extend_schema
from ferry_cloud.errors import Invalid
from registry.selectors import version_get
from rest_framework import serializers, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.settings import api_settings

from releases import selectors, services
from releases.models import DeviceReleaseStatus, Release, ReleaseEvent


class EventOutput(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None)
    from_phase = serializers.SerializerMethodField()
    to_phase = serializers.SerializerMethodField()

    class Meta:
        model = ReleaseEvent
        fields = [
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

    def get_from_phase(self, obj: ReleaseEvent) -> int | None:
        return None if obj.from_phase is None else obj.from_phase + 1

    def get_to_phase(self, obj: ReleaseEvent) -> int | None:
        return None if obj.to_phase is None else obj.to_phase + 1


class ReleaseOutput(serializers.ModelSerializer):
    version = serializers.SerializerMethodField()
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

    def get_version(self, obj: Release) -> dict:
        v = obj.version
        return {"id": str(v.id), "model": v.model.name, "label": v.label}

    def get_phase(self, obj: Release) -> int:
        return obj.current_phase + 1

    def get_phases(self, obj: Release) -> list[dict]:
        return [p.as_dict() for p in selectors.release_phases(obj)]

    def get_devices(self, obj: Release) -> dict[str, int]:
        if "spread" not in self.context:  # one query per answer, however many releases it lists
            self.context["spread"] = selectors.fleet_version_spread(organisation_id=obj.organisation_id)
        counts = selectors.release_device_counts(release=obj, spread=self.context["spread"])
        # the target's live matching devices, as of the last start, advance or gate evaluation
        devices = {**counts, "matching": obj.matching_devices}
        if self.context.get("detail"):  # per-device states cost a selection: the detail view only
            devices["by_state"] = selectors.release_device_summary(release=obj)
        return devices

    def get_percentage(self, obj: Release) -> float:
        return selectors.release_phases(obj)[obj.current_phase].percentage


class StrictSerializer(serializers.Serializer):
    def to_internal_value(self, data):
        unknown = set(data) - set(self.fields) if isinstance(data, dict) else set()
        if unknown:  # a typo must not silently widen a target or drop a threshold
            message = f"Unknown field(s): {', '.join(sorted(unknown))}."
            raise serializers.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [message]})
        return super().to_internal_value(data)


class TargetInput(StrictSerializer):
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False)
    device_ids = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=100_000)
    group_ids = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=1000)
    filter = serializers.CharField(required=False, allow_blank=True, max_length=4000, trim_whitespace=False)
    percentage = serializers.FloatField(min_value=0.0, max_value=100.0, required=False)


class PhaseInput(StrictSerializer):
    percentage = serializers.FloatField(min_value=0.0, max_value=100.0)
    min_soak_seconds = serializers.IntegerField(min_value=0, required=False, default=0)
    min_reporting_devices = serializers.IntegerField(min_value=0, required=False, default=0)
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
    duration_seconds = serializers.IntegerField(min_value=60)
    timezone = serializers.CharField(max_length=64, required=False, default="UTC")


class ReleaseInput(StrictSerializer):
    name = serializers.CharField(max_length=200)
    version = serializers.UUIDField()
    target = TargetInput(required=False, default=dict)
    priority = serializers.IntegerField(required=False, default=0)
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
        required=False, min_value=0, help_text="The revision you saw; 409 if the release moved since."
    )
    phase = serializers.IntegerField(
        required=False, min_value=1, help_text="advance only: the phase to leave (makes advance idempotent)."
    )


def _plain(data):
    """Serializer output (OrderedDicts, UUIDs) as JSON-ready values for the model's JSON fields."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return str(data) if data.__class__.__name__ == "UUID" else data


class ReleaseListCreateApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(responses=ReleaseOutput(many=True))
    def get(self, request):
        releases = selectors.release_list(organisation=self.organisation).prefetch_related("events__actor")
        return Response(ReleaseOutput(releases, many=True).data)

    @extend_schema(request=ReleaseInput, responses={201: ReleaseOutput})
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
        return Response(ReleaseOutput(release).data, status=status.HTTP_201_CREATED)


class ReleaseDetailApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(responses=ReleaseOutput)
    def get(self, request, release_id):
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        return Response(ReleaseOutput(release, context={"detail": True}).data)


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
        rows = selectors.release_device_statuses(release=release, state=state)
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(DeviceStatusOutput(page, many=True).data)


class ReleaseActionApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(request=ActionInput, responses=ReleaseOutput, operation_id="v1_releases_action")
    def post(self, request, release_id, action: str):
        """start, pause, resume, advance, abort, rollback or activate (download-only releases)."""
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
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
        return Response(ReleaseOutput(release).data)


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
