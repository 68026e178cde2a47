"""Serializer pieces every REST app shares: strict inputs and the embedded version reference."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.settings import api_settings


class StrictSerializer(serializers.Serializer):
    """An input that refuses fields it does not declare (400 naming them)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        unknown = set(data) - set(self.fields) if isinstance(data, dict) else set()
        if unknown:  # a typo must not silently widen a target or drop a threshold
            message = f"Unknown field(s): {', '.join(sorted(unknown))}."
            raise serializers.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [message]})
        return super().to_internal_value(data)


class VersionRefOutput(serializers.Serializer):
    """A model version embedded in another resource (the version's own resource has the rest)."""

    id = serializers.UUIDField()
    model = serializers.CharField(help_text="The model's name.")
    label = serializers.CharField()


def version_ref(version) -> dict[str, str] | None:
    if version is None:
        return None
    return {"id": str(version.id), "model": version.model.name, "label": version.label}


# A nullable embedded version for extend_schema_field (the serializer's allow_null is not carried
# into the document); ReleaseOutput's non-null version_info keeps the component in it.
NULLABLE_VERSION_REF = {"oneOf": [{"$ref": "#/components/schemas/VersionRefOutput"}, {"type": "null"}]}
