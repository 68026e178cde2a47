"""REST doors onto fleet services."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Literal

from accounts.api import OrganisationApi
from accounts.models import Membership
from accounts.permissions import AdminWrites, OperatorWrites, ReadOnly, ViewerQueries
from accounts.selectors import role_require
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from ferry_cloud.api_conditions import IF_MATCH, created, require_match, tagged
from ferry_cloud.api_lists import ListQuery, list_query, page_of, paginated
from ferry_cloud.api_shapes import NULLABLE_VERSION_REF, StrictSerializer, version_ref
from ferry_cloud.errors import Invalid, NotFound
from ferry_cloud.idempotency import HEADER as IDEMPOTENCY_KEY
from ferry_cloud.idempotency import idempotent
from ferry_cloud.release_key import current_sequence, release_key_status
from rest_framework import serializers, status
from rest_framework.response import Response

from deploy.errors import PolicyError
from deploy.filters import Filter
from deploy.windows import MAX_DURATION_SECONDS
from fleet import bulk, selectors, services
from fleet.models import Device, DeviceGroup, DeviceVersionChange, EnrolmentToken


class InvalidFilter(Invalid):
    code = "invalid_filter"


class TokenInput(serializers.Serializer):
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False, default=dict)
    ttl_hours = serializers.IntegerField(
        min_value=1,
        max_value=24 * 30,
        required=False,
        help_text="Lifetime; default FERRY_ENROLMENT_TOKEN_HOURS (24).",
    )


class TokenOutput(serializers.Serializer):
    id = serializers.IntegerField()
    token = serializers.CharField(help_text="Shown once; give it to one device.")
    expires_at = serializers.DateTimeField()
    labels = serializers.DictField()
    bundle = serializers.CharField(
        help_text="The line a device enrols with (`ferry-agent enrol <bundle>`): gateway addresses, "
        "the token and the device CA. Empty unless FERRY_GATEWAY_PUBLIC_ADDRESS and "
        "FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS are set."
    )


class TokenRecordOutput(serializers.ModelSerializer):
    state = serializers.SerializerMethodField()

    class Meta:
        model = EnrolmentToken
        fields = ["id", "labels", "state", "expires_at", "used_at", "created_at"]

    def get_state(self, obj: EnrolmentToken) -> Literal["unused", "used", "expired"]:
        if obj.used_at is not None:
            return "used"
        return "expired" if obj.expires_at <= timezone.now() else "unused"


class TokenQuery(ListQuery):
    ORDERING = ("-created_at", "created_at")


class EnrolmentTokenCreateApi(OrganisationApi):
    permission_classes = [AdminWrites]

    @extend_schema(
        parameters=[TokenQuery],
        responses=page_of(TokenRecordOutput, "EnrolmentTokenPage"),
        operation_id="v1_enrolment_tokens_list",
    )
    def get(self, request):
        """The organisation's enrolment tokens (never the secret itself: it is shown once)."""
        query = list_query(TokenQuery, request)
        tokens = selectors.enrolment_token_list(organisation=self.organisation)
        return paginated(request, tokens, query, lambda rows: TokenRecordOutput(rows, many=True).data)

    @extend_schema(request=TokenInput, responses={201: TokenOutput}, parameters=[IDEMPOTENCY_KEY])
    @idempotent(secret=("token", "bundle"))
    def post(self, request):
        data = TokenInput(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.enrolment_token_create(
            organisation=self.organisation,
            labels=data.validated_data["labels"],
            ttl=timedelta(hours=hours) if (hours := data.validated_data.get("ttl_hours")) else None,
        )
        body = {
            "id": issued.record.pk,
            "token": issued.token,
            "expires_at": issued.record.expires_at,
            "labels": issued.record.labels,
            "bundle": services.enrolment_bundle_for_token(issued.token),
        }
        return Response(TokenOutput(body).data, status=status.HTTP_201_CREATED)


class EnrolmentTokenRevokeApi(OrganisationApi):
    permission_classes = [AdminWrites]

    @extend_schema(request=None, responses=TokenRecordOutput)
    def post(self, request, token_id):
        """Make an unused token unusable now; 409 if a device already enrolled with it."""
        record = selectors.enrolment_token_get(organisation=self.organisation, token_id=token_id)
        return Response(TokenRecordOutput(services.enrolment_token_revoke(record=record)).data)


class DeviceOutput(serializers.ModelSerializer):
    # a field named *version holds a version id, as on input; the embedded version is *_info
    running_version = serializers.UUIDField(source="running_version_id", allow_null=True, read_only=True)
    running_version_info = serializers.SerializerMethodField()
    pinned_version = serializers.UUIDField(source="pinned_version_id", allow_null=True, read_only=True)
    pinned_version_info = serializers.SerializerMethodField()
    telemetry_records = serializers.SerializerMethodField()
    release_key_status = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = [
            "id",
            "name",
            "attributes",
            "labels",
            "running_version",
            "running_version_info",
            "pinned_version",
            "pinned_version_info",
            "enrolled_at",
            "last_seen_at",
            "revoked_at",
            "telemetry_records",
            "release_key_sequence",
            "release_key_status",
        ]

    @extend_schema_field(NULLABLE_VERSION_REF)
    def get_running_version_info(self, obj: Device) -> dict | None:
        return version_ref(obj.running_version)

    @extend_schema_field(NULLABLE_VERSION_REF)
    def get_pinned_version_info(self, obj: Device) -> dict | None:
        return version_ref(obj.pinned_version)

    def get_release_key_status(self, obj: Device) -> str:
        """current, behind (catches up at its next check-in) or reenrol_required (too far behind)."""
        return release_key_status(obj.release_key_sequence, current_sequence())

    def get_telemetry_records(self, obj: Device) -> int:
        counted = getattr(obj, "telemetry_count", None)  # device_list annotates it
        return obj.telemetry.count() if counted is None else counted


class DeviceQuery(ListQuery):
    ORDERING = ("-enrolled_at", "enrolled_at", "name", "-name")

    filter = serializers.CharField(
        required=False, max_length=4000, trim_whitespace=False, help_text="Ferry's filter language."
    )
    group = serializers.UUIDField(required=False, help_text="Members of this device group now.")
    version = serializers.UUIDField(required=False, help_text="Devices running this version.")
    last_seen_after = serializers.DateTimeField(required=False)
    last_seen_before = serializers.DateTimeField(required=False)
    revoked = serializers.BooleanField(required=False, allow_null=True, default=None)


class DeviceListApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(
        parameters=[DeviceQuery],
        responses=page_of(DeviceOutput, "DevicePage"),
        operation_id="v1_devices_list",
    )
    def get(self, request):
        query = list_query(DeviceQuery, request)
        try:
            devices = selectors.device_list_filtered(
                organisation=self.organisation,
                filter_text=query.get("filter", ""),
                group_id=query.get("group"),
                version_id=query.get("version"),
                last_seen_after=query.get("last_seen_after"),
                last_seen_before=query.get("last_seen_before"),
                revoked=query["revoked"],
            )
        except PolicyError as exc:
            raise InvalidFilter(str(exc), fields={"filter": [str(exc)]}) from None
        except NotFound as exc:  # the list exists; its parameter names nothing
            raise Invalid(str(exc), fields={"group": [str(exc)]}) from None
        return paginated(request, devices, query, lambda rows: DeviceOutput(rows, many=True).data)


class VersionChangeOutput(serializers.ModelSerializer):
    from_version = serializers.UUIDField(source="from_version_id", allow_null=True, read_only=True)
    from_version_info = serializers.SerializerMethodField()
    to_version = serializers.UUIDField(source="to_version_id", allow_null=True, read_only=True)
    to_version_info = serializers.SerializerMethodField()

    class Meta:
        model = DeviceVersionChange
        fields = ["from_version", "from_version_info", "to_version", "to_version_info", "at"]

    @extend_schema_field(NULLABLE_VERSION_REF)
    def get_from_version_info(self, obj: DeviceVersionChange) -> dict | None:
        return version_ref(obj.from_version)

    @extend_schema_field(NULLABLE_VERSION_REF)
    def get_to_version_info(self, obj: DeviceVersionChange) -> dict | None:
        return version_ref(obj.to_version)


class DeviceDetailOutput(DeviceOutput):
    history = serializers.SerializerMethodField(help_text="The latest 50 version changes, newest first.")

    class Meta(DeviceOutput.Meta):
        fields = [*DeviceOutput.Meta.fields, "history"]

    @extend_schema_field(VersionChangeOutput(many=True))
    def get_history(self, obj: Device) -> list[dict]:
        return VersionChangeOutput(selectors.device_version_history(device=obj), many=True).data


LABEL_KEY = r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$"


class DeviceUpdateInput(StrictSerializer):
    labels = serializers.DictField(
        child=serializers.CharField(max_length=200), help_text="Replaces all the labels (64 at most)."
    )

    def validate_labels(self, labels: dict[str, str]) -> dict[str, str]:
        if len(labels) > 64:
            raise serializers.ValidationError(f"{len(labels)} labels; a device has 64 at most.")
        bad = [key for key in labels if not re.match(LABEL_KEY, key)]
        if bad:
            raise serializers.ValidationError(
                f"Label names must match {LABEL_KEY}: {', '.join(sorted(bad))}."
            )
        return labels


class DeviceDetailApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(responses=DeviceDetailOutput)
    def get(self, request, device_id):
        """The device, the version it runs and is pinned to, and its version history."""
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        return tagged(Response(DeviceDetailOutput(device).data))

    @extend_schema(request=DeviceUpdateInput, responses=DeviceDetailOutput, parameters=[IF_MATCH])
    def patch(self, request, device_id):
        """Edit the device's labels (the filters, groups and release targets that read them follow)."""
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        require_match(request, DeviceDetailOutput(device).data)
        data = DeviceUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.device_labels_set(device=device, labels=data.validated_data["labels"])
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        return tagged(Response(DeviceDetailOutput(device).data))


class BulkInput(StrictSerializer):
    filter = serializers.CharField(
        required=False,
        max_length=4000,
        trim_whitespace=False,
        help_text="Ferry's filter language: the unrevoked devices it selects.",
    )
    device_ids = serializers.ListField(
        child=serializers.UUIDField(),
        required=False,
        max_length=bulk.MAX_DEVICES,
        help_text="Or the devices by id (give filter or device_ids).",
    )
    action = serializers.ChoiceField(choices=list(bulk.ACTIONS), help_text="revoke needs an admin.")
    version = serializers.UUIDField(required=False, help_text="pin: the version to pin to.")
    labels = serializers.DictField(
        child=serializers.CharField(max_length=200, allow_null=True),
        required=False,
        help_text="label: labels to set on every device (null removes that label); the others stay.",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Count what would change and change nothing."
    )

    def validate_labels(self, labels: dict) -> dict:
        return DeviceUpdateInput().validate_labels(labels)


class BulkOutput(serializers.Serializer):
    matched = serializers.IntegerField(help_text="Devices selected (a filter selects unrevoked ones).")
    changed = serializers.IntegerField(help_text="Of those, the ones changed (a dry run: would be).")
    dry_run = serializers.BooleanField()


class DeviceBulkApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(
        request=BulkInput, responses=BulkOutput, parameters=[IDEMPOTENCY_KEY], operation_id="v1_devices_bulk"
    )
    @idempotent
    def post(self, request):
        """Pin, unpin, label or revoke (admins) the devices a filter or a list selects, at most
        10,000 a call (400 too_many_devices above); dry_run counts them and changes nothing."""
        data = BulkInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if values["action"] == "revoke":  # an admin's, as the single-device revoke is
            role_require(membership=self.membership, role=Membership.Role.ADMIN)
        try:
            outcome = bulk.devices_bulk(
                organisation=self.organisation,
                action=values["action"],
                filter_text=values.get("filter"),
                device_ids=[str(d) for d in values["device_ids"]] if "device_ids" in values else None,
                version_id=str(values["version"]) if "version" in values else None,
                labels=values.get("labels"),
                dry_run=values["dry_run"],
                actor=request.user,
            )
        except PolicyError as exc:
            raise InvalidFilter(str(exc), fields={"filter": [str(exc)]}) from None
        body = {"matched": outcome.matched, "changed": outcome.changed, "dry_run": values["dry_run"]}
        return Response(BulkOutput(body).data)


class DeviceRevokeApi(OrganisationApi):
    permission_classes = [AdminWrites]

    @extend_schema(request=None, responses=DeviceOutput, parameters=[IF_MATCH])
    def post(self, request, device_id):
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        require_match(request, DeviceDetailOutput(device).data)
        services.device_revoke(device=device)
        device.refresh_from_db()
        return Response(DeviceOutput(device).data)


class PinInput(serializers.Serializer):
    version = serializers.UUIDField(allow_null=True, help_text="The version to pin to; null unpins.")


class DevicePinApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(request=PinInput, responses=DeviceOutput, parameters=[IF_MATCH])
    def post(self, request, device_id):
        """Pin the device to a version (it runs that version whatever the releases say), or unpin it."""
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        require_match(request, DeviceDetailOutput(device).data)
        data = PinInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.device_pin(device=device, version_id=data.validated_data["version"])
        return Response(
            DeviceOutput(selectors.device_get(organisation=self.organisation, device_id=device_id)).data
        )


class WindowField(serializers.Serializer):
    cron = serializers.CharField(max_length=100)
    duration_seconds = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_SECONDS)
    timezone = serializers.CharField(max_length=64, required=False, default="UTC")


class GroupOutput(serializers.ModelSerializer):
    pinned_version = serializers.UUIDField(source="pinned_version_id", allow_null=True, read_only=True)
    pinned_version_info = serializers.SerializerMethodField()
    device_ids = serializers.SerializerMethodField(
        help_text="Members now (a dynamic group's filter decides)."
    )

    class Meta:
        model = DeviceGroup
        fields = [
            "id",
            "name",
            "kind",
            "filter",
            "window",
            "pinned_version",
            "pinned_version_info",
            "device_ids",
            "created_at",
        ]

    @extend_schema_field(NULLABLE_VERSION_REF)
    def get_pinned_version_info(self, obj: DeviceGroup) -> dict | None:
        return version_ref(obj.pinned_version)

    def get_device_ids(self, obj: DeviceGroup) -> list[str]:
        members = self.context.get("members")  # a list answer reads them for all groups at once
        if members is not None and obj.pk in members:
            return members[obj.pk]
        return selectors.device_group_member_ids(group=obj)


class GroupInput(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(choices=DeviceGroup.Kind.choices, required=False, default="static")
    filter = serializers.CharField(required=False, allow_blank=True, default="", max_length=4000)
    device_ids = serializers.ListField(child=serializers.UUIDField(), required=False, default=list)
    window = WindowField(required=False, allow_null=True, default=None)
    pinned_version = serializers.UUIDField(required=False, allow_null=True, default=None)


class GroupUpdateInput(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    filter = serializers.CharField(required=False, allow_blank=True, max_length=4000)
    window = WindowField(required=False, allow_null=True)
    pinned_version = serializers.UUIDField(required=False, allow_null=True)
    add_device_ids = serializers.ListField(child=serializers.UUIDField(), required=False)
    remove_device_ids = serializers.ListField(child=serializers.UUIDField(), required=False)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if value.__class__.__name__ == "UUID" else value


class GroupQuery(ListQuery):
    ORDERING = ("name", "-name", "-created_at", "created_at")


class GroupListCreateApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    @extend_schema(
        parameters=[GroupQuery],
        responses=page_of(GroupOutput, "DeviceGroupPage"),
        operation_id="v1_device_groups_list",
    )
    def get(self, request):
        query = list_query(GroupQuery, request)
        groups = selectors.device_group_list(organisation=self.organisation)

        def serialize(rows):
            members = selectors.device_group_members(groups=rows)
            return GroupOutput(rows, many=True, context={"members": members}).data

        return paginated(request, groups, query, serialize)

    @extend_schema(request=GroupInput, responses={201: GroupOutput}, parameters=[IDEMPOTENCY_KEY])
    @idempotent
    def post(self, request):
        data = GroupInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = _plain(data.validated_data)
        group = services.device_group_create(
            organisation=self.organisation,
            name=values["name"],
            kind=values["kind"],
            filter_text=values["filter"],
            device_ids=values["device_ids"],
            window=values["window"],
            pinned_version_id=values["pinned_version"],
        )
        return created(request, GroupOutput(group).data, "device-group", group_id=group.pk)


class GroupDetailApi(OrganisationApi):
    permission_classes = [OperatorWrites]

    def _group(self, group_id) -> DeviceGroup:
        return selectors.device_group_get(organisation=self.organisation, group_id=group_id)

    @extend_schema(responses=GroupOutput)
    def get(self, request, group_id):
        return tagged(Response(GroupOutput(self._group(group_id)).data))

    @extend_schema(request=GroupUpdateInput, responses=GroupOutput, parameters=[IF_MATCH])
    def patch(self, request, group_id):
        group = self._group(group_id)
        require_match(request, GroupOutput(group).data)
        data = GroupUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = _plain(data.validated_data)
        renamed = {"filter": "filter_text", "pinned_version": "pinned_version_id"}
        services.device_group_update(group=group, **{renamed.get(k, k): v for k, v in values.items()})
        return tagged(Response(GroupOutput(self._group(group_id)).data))

    @extend_schema(request=None, responses={204: None}, parameters=[IF_MATCH])
    def delete(self, request, group_id):
        group = self._group(group_id)
        require_match(request, GroupOutput(group).data)
        services.device_group_delete(group=group)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FilterPreviewInput(serializers.Serializer):
    filter = serializers.CharField(max_length=4000, trim_whitespace=False)


class FilterPreviewOutput(serializers.Serializer):
    filter = serializers.CharField(help_text="The canonical form of the expression.")
    matching_devices = serializers.IntegerField()
    device_ids = serializers.ListField(child=serializers.CharField(), help_text="The first 100.")


class FilterPreviewApi(OrganisationApi):
    permission_classes = [ViewerQueries]

    @extend_schema(request=FilterPreviewInput, responses=FilterPreviewOutput)
    def post(self, request):
        """Check a filter expression and see which devices it selects now, before releasing to them."""
        data = FilterPreviewInput(data=request.data)
        data.is_valid(raise_exception=True)
        text = data.validated_data["filter"]
        try:
            canonical = Filter.parse(text).text
            ids = selectors.devices_matching(organisation_id=self.organisation.pk, filter_text=text)
        except PolicyError as exc:
            raise InvalidFilter(str(exc)) from None
        return Response(
            FilterPreviewOutput(
                {"filter": canonical, "matching_devices": len(ids), "device_ids": ids[:100]}
            ).data
        )
