"""REST door onto the fleet's live figures."""

from __future__ import annotations

from accounts.api import OrganisationApi
from accounts.permissions import ReadOnly
from drf_spectacular.utils import extend_schema
from ferry_cloud.api_lists import ListQuery, list_query, page_of, paginated
from fleet.selectors import device_get, devices_per_version
from rest_framework import serializers
from rest_framework.response import Response

from telemetry.models import TelemetryRecord
from telemetry.selectors import fleet_rates, record_counts, telemetry_list


class SummaryOutput(serializers.Serializer):
    devices_per_version = serializers.ListField(child=serializers.DictField())
    rates = serializers.DictField()
    telemetry_records_per_device = serializers.DictField(child=serializers.IntegerField())


class FleetSummaryApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(responses=SummaryOutput)
    def get(self, request):
        org = self.organisation
        return Response(
            {
                "devices_per_version": devices_per_version(organisation=org),
                "rates": fleet_rates(organisation=org),
                "telemetry_records_per_device": record_counts(organisation=org),
            }
        )


class RecordOutput(serializers.ModelSerializer):
    class Meta:
        model = TelemetryRecord
        fields = ["seq", "kind", "timestamp", "version_id", "payload", "received_at"]


class RecordQuery(ListQuery):
    ORDERING = ("-received_at", "received_at")

    kind = serializers.CharField(required=False, max_length=32, help_text="metrics, activation, ...")
    after = serializers.DateTimeField(required=False, help_text="Records the device made at or after this.")
    before = serializers.DateTimeField(required=False, help_text="Records the device made before this.")


class DeviceTelemetryApi(OrganisationApi):
    permission_classes = [ReadOnly]

    @extend_schema(
        parameters=[RecordQuery],
        responses=page_of(RecordOutput, "TelemetryRecordPage"),
        operation_id="v1_device_telemetry_list",
    )
    def get(self, request, device_id):
        """The device's telemetry records, newest first."""
        device = device_get(organisation=self.organisation, device_id=device_id)
        query = list_query(RecordQuery, request)
        records = telemetry_list(
            device=device, kind=query.get("kind"), after=query.get("after"), before=query.get("before")
        )
        return paginated(request, records, query, lambda rows: RecordOutput(rows, many=True).data)
