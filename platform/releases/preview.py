"""What a release would reach before it is made: the devices its target matches now, and
whether the version fits what they run (the console's New release form asks as you type)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accounts.models import Organisation
from ferry_cloud.errors import Invalid
from registry.models import ModelVersion

from deploy.errors import PolicyError
from releases.compatibility import Verdict, compatibility
from releases.models import Release
from releases.selectors import release_matching_devices


class InvalidTarget(Invalid):
    code = "invalid_target"


@dataclass(frozen=True)
class TargetPreview:
    matching: int
    verdict: Verdict | None  # None when no version was given

    def as_dict(self, version: ModelVersion | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {"matching": self.matching}
        if self.verdict is not None:
            data["compatibility"] = {**self.verdict.as_dict(), "message": self.verdict.message(version)}
        return data


def release_target_preview(
    *, organisation: Organisation, target: dict[str, Any], version: ModelVersion | None = None
) -> TargetPreview:
    """The live devices this target matches now (percentages aside), and the version's fit."""
    probe = Release(organisation=organisation, version=version, target=target, phases=[])
    try:
        found = release_matching_devices(probe)
    except (PolicyError, TypeError, ValueError) as exc:
        raise InvalidTarget(f"Invalid target: {exc}") from None
    verdict = None if version is None else compatibility(version=version, device_ids=list(found))
    return TargetPreview(matching=len(found), verdict=verdict)
