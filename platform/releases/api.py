"""REST doors onto release services."""

from __future__ import annotations

from accounts.api import OrganisationApi
from drf_spectacular.utils import extend_schema
from registry.selectors import version_get
from rest_framework import serializers, status
from rest_framework.response import Response

from releases import selectors, services
from releases.models import Release, ReleaseEvent


class EventOutput(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None)

    class Meta:
        model = ReleaseEvent
        fields = ["action", "from_state", "to_state", "actor", "reason", "at"]


class ReleaseOutput(serializers.ModelSerializer):
    version = serializers.SerializerMethodField()
    events = EventOutput(many=True)

    class Meta:
        model = Release
        fields = ["id", "name", "state", "version", "target", "priority", "created_at", "events"]

    def get_version(self, obj: Release) -> dict:
        v = obj.version
        return {"id": str(v.id), "model": v.model.name, "label": v.label}


class TargetInput(serializers.Serializer):
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False)
    device_ids = serializers.ListField(child=serializers.UUIDField(), required=False)
    percentage = serializers.FloatField(min_value=0.0, max_value=100.0, required=False)

    def to_internal_value(self, data):
        unknown = set(data) - set(self.fields) if isinstance(data, dict) else set()
        if unknown:  # a typo must not silently widen a target to the whole fleet
            raise serializers.ValidationError(f"Unknown target field(s): {', '.join(sorted(unknown))}.")
        return super().to_internal_value(data)


class ReleaseInput(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    version = serializers.UUIDField()
    target = TargetInput(required=False, default=dict)
    priority = serializers.IntegerField(required=False, default=0)
    start = serializers.BooleanField(required=False, default=False)


class ActionInput(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class ReleaseListCreateApi(OrganisationApi):
    @extend_schema(responses=ReleaseOutput(many=True))
    def get(self, request):
        releases = selectors.release_list(organisation=self.organisation).prefetch_related("events__actor")
        return Response(ReleaseOutput(releases, many=True).data)

    @extend_schema(request=ReleaseInput, responses={201: ReleaseOutput})
    def post(self, request):
        data = ReleaseInput(data=request.data)
        data.is_valid(raise_exception=True)
        target = dict(data.validated_data["target"])
        if "device_ids" in target:
            target["device_ids"] = [str(d) for d in target["device_ids"]]
        release = services.release_create(
            organisation=self.organisation,
            version=version_get(organisation=self.organisation, version_id=data.validated_data["version"]),
            name=data.validated_data["name"],
            target=target,
            priority=data.validated_data["priority"],
            actor=request.user,
            start=data.validated_data["start"],
        )
        release = selectors.release_get(organisation=self.organisation, release_id=release.pk)
        return Response(ReleaseOutput(release).data, status=status.HTTP_201_CREATED)


class ReleaseDetailApi(OrganisationApi):
    @extend_schema(responses=ReleaseOutput)
    def get(self, request, release_id):
        return Response(
            ReleaseOutput(selectors.release_get(organisation=self.organisation, release_id=release_id)).data
        )


class ReleaseActionApi(OrganisationApi):
    @extend_schema(request=ActionInput, responses=ReleaseOutput)
    def post(self, request, release_id, action: str):
        release = selectors.release_get(organisation=self.organisation, release_id=release_id)
        data = ActionInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.release_transition(
            release_id=release.pk, action=action, actor=request.user, reason=data.validated_data["reason"]
        )
        release = selectors.release_get(organisation=self.organisation, release_id=release.pk)
        return Response(ReleaseOutput(release).data)
