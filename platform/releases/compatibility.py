"""Does a version fit what the targeted devices run now?  (deploy/compat.py compares.)

A device's contract is its running version's signature, as the registry recorded it at
conversion (the version's report: inputs and outputs).  Devices that run nothing yet, or
already run the version, are not asked.

An LLM adapter (kind llm_adapter) has no signature of its own: it fits a device whose running
version runs on the very base weights it was converted against (``llm_digest``: the base LLM
itself, or another adapter of it), and nothing else; a device running nothing, another model or
another base is incompatible (deploy.compat.adapter_mismatch words it, as the agent does when
it refuses such a package), and no override ships it anyway: the device could not run it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ferry_cloud.errors import Invalid
from fleet.models import Device
from registry.models import ModelVersion
from registry.services import llm_digest_of

from deploy.compat import Mismatch, adapter_mismatch, contract_of, describe, mismatches


class IncompatibleVersion(Invalid):
    code = "incompatible_version"


@dataclass(frozen=True)
class Incompatibility:
    """One running version the new one does not fit, and how many targeted devices run it."""

    running: str  # "model:label"
    devices: int
    mismatches: list[Mismatch]

    def as_dict(self) -> dict:
        return {
            "running": self.running,
            "devices": self.devices,
            "mismatches": [str(m) for m in self.mismatches],
        }


@dataclass(frozen=True)
class Verdict:
    checked: int  # targeted devices that run another version
    incompatible: list[Incompatibility] = field(default_factory=list)

    @property
    def affected(self) -> int:
        return sum(i.devices for i in self.incompatible)

    @property
    def fits(self) -> bool:
        return not self.incompatible

    def message(self, version: ModelVersion) -> str:
        if self.fits:
            return f"{version} fits what the {self.checked} targeted device(s) with a model run now."
        parts = [f"{i.running} on {i.devices} device(s): {describe(i.mismatches)}" for i in self.incompatible]
        return f"{version} does not fit what {self.affected} of the targeted devices run now — " + " | ".join(
            parts
        )

    def as_dict(self) -> dict:
        return {
            "fits": self.fits,
            "checked": self.checked,
            "affected": self.affected,
            "incompatible": [i.as_dict() for i in self.incompatible],
        }


def version_signature(version: ModelVersion) -> dict:
    """The version's inputs and outputs as the converter reported them."""
    report = version.report or {}
    return {"inputs": report.get("inputs") or [], "outputs": report.get("outputs") or []}


def compatibility(*, version: ModelVersion, device_ids: list[str]) -> Verdict:
    """How the version fits each running version among these devices (one query for the counts)."""
    if version.kind == ModelVersion.Kind.LLM_ADAPTER:
        return adapter_compatibility(version=version, device_ids=device_ids)
    rows = (
        Device.objects.filter(pk__in=device_ids, running_version__isnull=False)
        .exclude(running_version=version)
        .values_list("running_version_id", flat=True)
    )
    per_version = Counter(rows)
    if not per_version:
        return Verdict(checked=0)
    signature = version_signature(version)
    running = ModelVersion.objects.filter(pk__in=per_version).select_related("model")
    incompatible = []
    for other in sorted(running, key=str):
        found = mismatches(contract_of(version_signature(other)), signature["inputs"], signature["outputs"])
        if found:
            incompatible.append(Incompatibility(str(other), per_version[other.pk], found))
    return Verdict(checked=sum(per_version.values()), incompatible=incompatible)


def adapter_compatibility(*, version: ModelVersion, device_ids: list[str]) -> Verdict:
    """How an adapter fits these devices: each must run its base weights (devices running nothing
    count too: an adapter alone runs nowhere)."""
    rows = (
        Device.objects.filter(pk__in=device_ids)
        .exclude(running_version=version)
        .values_list("running_version_id", flat=True)
    )
    per_version = Counter(rows)
    running = {v.pk: v for v in ModelVersion.objects.filter(pk__in=[pk for pk in per_version if pk])}
    base = str(version.base) if version.base_id else "its base"
    incompatible = []
    for pk, devices in sorted(per_version.items(), key=lambda item: str(running.get(item[0], ""))):
        other = running.get(pk)
        runs_on = llm_digest_of(other) if other is not None else ""
        found = adapter_mismatch(version.llm_digest, runs_on)
        if found is not None:
            name = str(other) if other is not None else "nothing"
            incompatible.append(Incompatibility(name, devices, [Mismatch("base", base, found)]))
    return Verdict(checked=sum(per_version.values()), incompatible=incompatible)


def require_compatible(*, version: ModelVersion, device_ids: list[str], new_pipeline: bool = False) -> dict:
    """Refuse a version that does not fit what the targeted devices run (a 400 naming it),
    unless the release ships a new pipeline; returns what the release's create event records
    of an override ({} when there was nothing to override)."""
    verdict = compatibility(version=version, device_ids=device_ids)
    if verdict.fits:
        return {}
    if version.kind == ModelVersion.Kind.LLM_ADAPTER:  # no pipeline makes an adapter run without its base
        raise IncompatibleVersion(
            verdict.message(version) + ". Release the base LLM to those devices first, or target only "
            "devices that run it."
        )
    if not new_pipeline:
        raise IncompatibleVersion(
            verdict.message(version)
            + '. If the release ships a new pipeline with the model, pass "new_pipeline": true.'
        )
    return {"new_pipeline": True, "compatibility": verdict.as_dict()}
