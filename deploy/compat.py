"""Does a package fit what a device feeds it?  Pure signature comparison, no I/O.

A signature is the manifest's ``inputs`` / ``outputs`` format (see converter/translate.py):
a list of ``{"name", "dtype", "shape"}`` where ``shape`` is a list of ints (fixed dims) and
strings (symbolic dims, e.g. a batch ``"N"``), or None when even the rank is unknown.

A device's *contract* is what it runs now: the tensors its pipeline (or inference loop)
assembles and feeds, and the outputs its post-processing reads.  A new package fits when:

- inputs: it takes exactly the inputs the device feeds (no missing, no extra), each with the
  same dtype and rank; a dim the package fixes must be fixed to the same size in the
  contract (a symbolic dim in the contract means the device feeds varying sizes, e.g. its
  batch, which a fixed dim would refuse at run time);
- outputs: it still produces every output the device reads, with the same dtype and rank,
  and every dim the device relies on (fixed in the contract) fixed to the same size.

Symbolic dim names are not compared: the converter invents names for unnamed dims, so two
packages of the same model may call the same batch dim differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Signature = list[dict[str, Any]]


@dataclass(frozen=True)
class Mismatch:
    """One reason a package does not fit a contract: which tensor, and what differs."""

    kind: str  # "input" or "output"
    tensor: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} {self.tensor!r}: {self.reason}"


@dataclass(frozen=True)
class Contract:
    """What a device feeds (inputs) and reads (outputs)."""

    inputs: Signature
    outputs: Signature


def _shape_text(shape: list | None) -> str:
    return "unknown rank" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _dims(kind: str, name: str, fed: list | None, taken: list | None, *, inputs: bool) -> list[Mismatch]:
    """Compare shapes: ``fed`` is the device's side, ``taken`` the new package's."""
    if fed is None or taken is None:
        return []  # an unknown rank promises nothing to compare
    if len(fed) != len(taken):
        return [
            Mismatch(
                kind,
                name,
                f"rank {len(taken)} {_shape_text(taken)} in the package, "
                f"rank {len(fed)} {_shape_text(fed)} on the device",
            )
        ]
    found = []
    for axis, (have, want) in enumerate(zip(fed, taken, strict=True)):
        if inputs:
            bad = isinstance(want, int) and have != want  # symbolic or other size fed to a fixed dim
        else:
            bad = isinstance(have, int) and isinstance(want, int) and have != want
        if bad:
            found.append(
                Mismatch(
                    kind,
                    name,
                    f"dim {axis} is {want} in the package, {have} on the device "
                    f"(package {_shape_text(taken)}, device {_shape_text(fed)})",
                )
            )
    return found


def _by_name(signature: Signature) -> dict[str, dict[str, Any]]:
    return {str(spec["name"]): spec for spec in signature}


def _compare(kind: str, device: Signature, package: Signature, *, extra_is_mismatch: bool) -> list[Mismatch]:
    device_specs, package_specs = _by_name(device), _by_name(package)
    found: list[Mismatch] = []
    if kind == "input":
        for name in package_specs.keys() - device_specs.keys():
            found.append(Mismatch(kind, name, "the package needs it; the device does not feed it"))
    else:
        for name in device_specs.keys() - package_specs.keys():
            found.append(Mismatch(kind, name, "the device reads it; the package does not produce it"))
    if extra_is_mismatch:
        for name in device_specs.keys() - package_specs.keys():
            found.append(Mismatch(kind, name, "the device feeds it; the package has no such input"))
    for name in sorted(device_specs.keys() & package_specs.keys()):
        have, want = device_specs[name], package_specs[name]
        if have.get("dtype") != want.get("dtype"):
            found.append(
                Mismatch(
                    kind, name, f"dtype {want.get('dtype')} in the package, {have.get('dtype')} on the device"
                )
            )
        found.extend(_dims(kind, name, have.get("shape"), want.get("shape"), inputs=kind == "input"))
    return sorted(found, key=lambda m: (m.kind, m.tensor, m.reason))


def mismatches(contract: Contract, inputs: Signature, outputs: Signature) -> list[Mismatch]:
    """Every way a package with these inputs and outputs does not fit the contract ([] = fits)."""
    return _compare("input", contract.inputs, inputs, extra_is_mismatch=True) + _compare(
        "output", contract.outputs, outputs, extra_is_mismatch=False
    )


def pipeline_inputs(pipeline: dict[str, Any] | None, package_inputs: Signature) -> Signature:
    """The inputs a device feeds when it runs this pipeline with a package of these inputs.

    A pipeline with ``features`` feeds one float32 ``[rows, len(values)]`` tensor to the input
    it names (its first input if unnamed): that tensor replaces the package's own description,
    since it is what really arrives.  Without features the package's inputs stand.
    """
    features = (pipeline or {}).get("features")
    if not features:
        return list(package_inputs)
    default = package_inputs[0]["name"] if package_inputs else "input"
    name = features.get("input") or default
    batch = (pipeline or {}).get("batch") or {}
    rows: int | str = 1 if batch.get("size") == 1 else "batch"  # a partial batch runs after max_wait_ms
    return [{"name": name, "dtype": "float32", "shape": [rows, len(features.get("values", []))]}]


def contract_of(manifest_or_report: dict[str, Any]) -> Contract:
    """The contract a device running this package has: its inputs as its pipeline feeds them
    (``metadata.pipeline`` of a manifest, if any) and its outputs."""
    inputs = list(manifest_or_report.get("inputs") or [])
    pipeline = (manifest_or_report.get("metadata") or {}).get("pipeline")
    return Contract(pipeline_inputs(pipeline, inputs), list(manifest_or_report.get("outputs") or []))


def describe(found: list[Mismatch], limit: int = 3) -> str:
    """The first few mismatches in one line, for an error message."""
    text = "; ".join(str(m) for m in found[:limit])
    return text + (f"; and {len(found) - limit} more" if len(found) > limit else "")


def adapter_mismatch(adapter_base: str, device_base: str | None) -> str | None:
    """Why an LLM adapter bound to the base weights ``adapter_base`` (engine.llm.lora.base_digest)
    cannot run beside what a device runs, whose LLM base weights are ``device_base`` (None or "":
    no LLM base at all); None when it fits.  The control plane refuses such a release and the
    agent refuses such a package, with the same words."""
    if not device_base:
        return f"the adapter needs its base LLM (weights {adapter_base[:12]}); the device runs no LLM"
    if device_base != adapter_base:
        return (
            f"the adapter is bound to base weights {adapter_base[:12]}; "
            f"the device's LLM base is {device_base[:12]}"
        )
    return None
