"""REST door onto the fleet's live figures."""

from __future__ import annotations

from accounts.api import OrganisationApi
from accounts.permissions import ReadOnly
from drf_spectacular.utils import extend_schema
from fleet.selectors import devices_per_version
from rest_framework import serializers
from rest_framework.response import Response

from telemetry.selectors import fleet_rates, record_counts


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
