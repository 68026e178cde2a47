"""REST doors onto fleet services."""

from __future__ import annotations

from datetime import timedelta

from accounts.api import OrganisationApi
from accounts.permissions import AdminWrites, OperatorWrites, ReadOnly, ViewerQueries
from drf_spectacular.utils import extend_schema
from ferry_cloud.errors import Invalid
from rest_framework import serializers, status
from rest_framework.response import Response

from deploy.errors import PolicyError
from deploy.filters import Filter
from fleet import selectors, services
from fleet.models import Device, DeviceGroup


class TokenInput(serializers.Serializer):
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False, default=dict)
    ttl_hours = serializers.IntegerField(min_value=1, max_value=24 * 30, required=False, default=24)


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once; give it to one device.")
    expires_at = serializers.DateTimeField()
    labels = serializers.DictField()
    bundle = serializers.CharField(
        help_text="The line a device enrols with (`ferry-agent enrol <bundle>`): gateway addresses, "
        "the token and the device CA. Empty unless FERRY_GATEWAY_PUBLIC_ADDRESS and "
        "FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS are set."
    )


class EnrolmentTokenCreateApi(OrganisationApi):
    permission_classes = [AdminWrites]
    @extend_schema(request=TokenInput, responses={201: TokenOutput})
    def post(self, request):
        data = TokenInput(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.enrolment_token_create(
            organisation=self.organisation,
            labels=data.validated_data["labels"],
            ttl=timedelta(hours=data.validated_data["ttl_hours"]),
        )
        body = {
            "token": issued.token,
            "expires_at": issued.record.expires_at,
            "labels": issued.record.labels,
            "bundle": services.enrolment_bundle_for_token(issued.token),
        }
        return Response(TokenOutput(body).data, status=status.HTTP_201_CREATED)


class DeviceOutput(serializers.ModelSerializer):
    running_version = serializers.SerializerMethodField()
    pinned_version = serializers.SerializerMethodField()
    telemetry_records = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = [
            "id",
            "name",
            "attributes",
            "labels",
            "running_version",
            "pinned_version",
            "enrolled_at",
            "last_seen_at",
            "revoked_at",
            "telemetry_records",
        ]

    def get_running_version(self, obj: Device) -> dict | None:
        v = obj.running_version
        return None if v is None else {"id": str(v.id), "model": v.model.name, "label": v.label}

    def get_pinned_version(self, obj: Device) -> dict | None:
        v = obj.pinned_version
        return None if v is None else {"id": str(v.id), "model": v.model.name, "label": v.label}

    def get_telemetry_records(self, obj: Device) -> int:
        counted = getattr(obj, "telemetry_count", None)  # device_list annotates it
        return obj.telemetry.count() if counted is None else counted


class DeviceListApi(OrganisationApi):
    permission_classes = [ReadOnly]
    @extend_schema(responses=DeviceOutput(many=True))
    def get(self, request):
        return Response(DeviceOutput(selectors.device_list(organisation=self.organisation), many=True).data)


class DeviceRevokeApi(OrganisationApi):
    permission_classes = [AdminWrites]
    @extend_schema(request=None, responses=DeviceOutput)
    def post(self, request, device_id):
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        services.device_revoke(device=device)
        device.refresh_from_db()
        return Response(DeviceOutput(device).data)


class PinInput(serializers.Serializer):
    version = serializers.UUIDField(allow_null=True, help_text="The version to pin to; null unpins.")


class DevicePinApi(OrganisationApi):
    permission_classes = [OperatorWrites]
    @extend_schema(request=PinInput, responses=DeviceOutput)
    def post(self, request, device_id):
        """Pin the device to a version (it runs that version whatever the releases say), or unpin it."""
        device = selectors.device_get(organisation=self.organisation, device_id=device_id)
        data = PinInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.device_pin(device=device, version_id=data.validated_data["version"])
        return Response(
            DeviceOutput(selectors.device_get(organisation=self.organisation, device_id=device_id)).data
        )


class WindowField(serializers.Serializer):
    cron = serializers.CharField(max_length=100)
    duration_seconds = serializers.IntegerField(min_value=60)
    timezone = serializers.CharField(max_length=64, required=False, default="UTC")


class GroupOutput(serializers.ModelSerializer):
    pinned_version = serializers.SerializerMethodField()
    device_ids = serializers.SerializerMethodField(
        help_text="Members now (a dynamic group's filter decides)."
    )

    class Meta:
        model = DeviceGroup
        fields = ["id", "name", "kind", "filter", "window", "pinned_version", "device_ids", "created_at"]

    def get_pinned_version(self, obj: DeviceGroup) -> dict | None:
        v = obj.pinned_version
        return None if v is None else {"id": str(v.id), "model": v.model.name, "label": v.label}

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


class GroupListCreateApi(OrganisationApi):
    permission_classes = [OperatorWrites]
    @extend_schema(responses=GroupOutput(many=True))
    def get(self, request):
        groups = list(selectors.device_group_list(organisation=self.organisation))
        members = selectors.device_group_members(groups=groups)
        return Response(GroupOutput(groups, many=True, context={"members": members}).data)

    @extend_schema(request=GroupInput, responses={201: GroupOutput})
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
        return Response(GroupOutput(group).data, status=status.HTTP_201_CREATED)


class GroupDetailApi(OrganisationApi):
    permission_classes = [OperatorWrites]
    @extend_schema(responses=GroupOutput)
    def get(self, request, group_id):
        return Response(
            GroupOutput(selectors.device_group_get(organisation=self.organisation, group_id=group_id)).data
        )

    @extend_schema(request=GroupUpdateInput, responses=GroupOutput)
    def patch(self, request, group_id):
        group = selectors.device_group_get(organisation=self.organisation, group_id=group_id)
        data = GroupUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = _plain(data.validated_data)
        renamed = {"filter": "filter_text", "pinned_version": "pinned_version_id"}
        services.device_group_update(group=group, **{renamed.get(k, k): v for k, v in values.items()})
        return Response(
            GroupOutput(selectors.device_group_get(organisation=self.organisation, group_id=group_id)).data
        )

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, group_id):
        services.device_group_delete(
            group=selectors.device_group_get(organisation=self.organisation, group_id=group_id)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class FilterPreviewInput(serializers.Serializer):
    filter = serializers.CharField(max_length=4000, trim_whitespace=False)


class FilterPreviewOutput(serializers.Serializer):
    filter = serializers.CharField(help_text="The canonical form of the expression.")
    matching_devices = serializers.IntegerField()
    device_ids = serializers.ListField(child=serializers.CharField(), help_text="The first 100.")


class InvalidFilter(Invalid):
    code = "invalid_filter"


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
