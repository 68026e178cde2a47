"""LoRA adapter versions (kind ``llm_adapter``): a PEFT adapter directory, uploaded as one tar or
zip, converted against the package of an LLM version of the same organisation (its ``base``)
with ``converter.llm.lora.convert_lora`` into a small adapter package bound to the base's weights.

The adapter's model name is stamped into its manifest (``metadata.name``) before it is signed:
devices serve the adapter under that name (agent/adapters.py), so the name a request uses is
signed like everything else the device acts on.  ``llm_digest`` records which base weights a
version runs on (engine.llm.lora.base_digest, reached through the converter): the release check
(releases.compatibility) compares it with what the targeted devices run.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from pathlib import Path

from converter.errors import ConversionError
from converter.llm.lora import base_digest, convert_lora
from deploy.package import MANIFEST
from deploy.package.manifest import canonical_json
from deploy.package.writer import write_archive
from registry.archives import extract_archive
from registry.checkpoints import Converted
from registry.errors import InvalidUpload
from registry.models import ModelVersion

Progress = Callable[[float, str], None]


def check_base(base: ModelVersion | None, organisation_id: int) -> ModelVersion:
    """The base an adapter upload names: an LLM version of this organisation with a package."""
    if base is None:
        raise _invalid("kind llm_adapter needs base: the id of the LLM version it was trained on.")
    if base.model.organisation_id != organisation_id:
        raise _invalid(f"No model version {base.pk} in this organisation.")
    if base.kind != ModelVersion.Kind.LLM:
        raise _invalid(f"base {base} is a {base.kind} version; an adapter's base is an llm version.")
    if base.status != ModelVersion.Status.READY or base.package_id is None:
        raise _invalid(f"base {base} is {base.status}; wait until it is converted.")
    return base


def _invalid(message: str) -> InvalidUpload:
    return InvalidUpload(message, fields={"base": [message]})


def package_llm_digest(package: Path) -> str:
    """The base-weights digest of an LLM package archive (signed or not)."""
    try:
        with tarfile.open(package, "r:*") as tar:
            reader = tar.extractfile(MANIFEST)
            manifest = json.loads(reader.read() if reader is not None else b"")
        return base_digest(manifest)
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise ConversionError(f"the base package has no readable LLM manifest ({exc})") from exc


def convert_adapter(
    archive: Path, workdir: Path, base_package: Path, dst: Path, name: str, progress: Progress
) -> Converted:
    """Extract the PEFT directory from ``archive`` and convert it against ``base_package`` into the
    unsigned package ``dst``, named ``name`` for the devices' chat API."""
    root = extract_archive(archive, workdir / "adapter")
    progress(0.05, "archive extracted")
    converted = workdir / "converted.ferry"
    try:
        report = convert_lora(root, base_package, converted).to_dict()
    except ConversionError as exc:  # name the uploaded files, not the worker's copies
        raise ConversionError(
            str(exc).replace(f"{root}/", "").replace(str(root), "the uploaded archive")
        ) from None
    stamp_name(converted, dst, name)
    report.update(source="the uploaded archive", base="the base version's package", name=name)
    report["package_size"] = dst.stat().st_size
    summary = (
        f"adapter rank {report['rank']} on {', '.join(report['targets'])}: "
        f"{report['adapter_bytes']:,} bytes of low-rank weights, bound to base weights "
        f"{report['base_digest'][:12]}"
    )
    progress(0.9, summary)
    return Converted(report, summary)


def stamp_name(src: Path, dst: Path, name: str) -> None:
    """Copy the unsigned package ``src`` to ``dst`` with ``metadata.name`` set (deterministic bytes)."""
    with tarfile.open(src, "r:") as tar:
        members = []
        for member in tar.getmembers():
            reader = tar.extractfile(member)
            members.append((member.name, reader.read() if reader is not None else b""))
    if not members or members[0][0] != MANIFEST:
        raise ConversionError("the converted adapter package does not start with its manifest")
    manifest = json.loads(members[0][1])
    manifest.setdefault("metadata", {})["name"] = name
    write_archive(dst, [(MANIFEST, canonical_json(manifest)), *members[1:]])
