"""REST doors onto fleet services."""

from __future__ import annotations

from datetime import timedelta

from accounts.api import OrganisationApi
from drf_spectacular.utils import extend_schema
from ferry_cloud.api_errors import NotFound
from rest_framework import serializers, status
from rest_framework.response import Response

from fleet import selectors, services
from fleet.models import Device


class TokenInput(serializers.Serializer):
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False, default=dict)
    ttl_hours = serializers.IntegerField(min_value=1, max_value=24 * 30, required=False, default=24)


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once; give it to one device.")
    expires_at = serializers.DateTimeField()
    labels = serializers.DictField()


class EnrolmentTokenCreateApi(OrganisationApi):
    @extend_schema(request=TokenInput, responses={201: TokenOutput})
    def post(self, request):
        data = TokenInput(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.enrolment_token_create(
            organisation=self.organisation,
            labels=data.validated_data["labels"],
            ttl=timedelta(hours=data.validated_data["ttl_hours"]),
        )
        body = {"token": issued.token, "expires_at": issued.record.expires_at, "labels": issued.record.labels}
        return Response(TokenOutput(body).data, status=status.HTTP_201_CREATED)


class DeviceOutput(serializers.ModelSerializer):
    running_version = serializers.SerializerMethodField()
    telemetry_records = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = [
            "id",
            "name",
            "attributes",
            "labels",
            "running_version",
            "enrolled_at",
            "last_seen_at",
            "revoked_at",
            "telemetry_records",
        ]

    def get_running_version(self, obj: Device) -> dict | None:
        v = obj.running_version
        return None if v is None else {"id": str(v.id), "model": v.model.name, "label": v.label}

    def get_telemetry_records(self, obj: Device) -> int:
        return obj.telemetry.count()


class DeviceListApi(OrganisationApi):
    @extend_schema(responses=DeviceOutput(many=True))
    def get(self, request):
        return Response(DeviceOutput(selectors.device_list(organisation=self.organisation), many=True).data)


class DeviceRevokeApi(OrganisationApi):
    @extend_schema(request=None, responses=DeviceOutput)
    def post(self, request, device_id):
        device = selectors.device_list(organisation=self.organisation).filter(pk=device_id).first()
        if device is None:
            raise NotFound(f"No device {device_id} in this organisation.")
        services.device_revoke(device=device)
        device.refresh_from_db()
        return Response(DeviceOutput(device).data)
