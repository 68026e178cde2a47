"""The manifest: what a package holds, and the format version a reader must understand.

``manifest.json`` is the archive's first member.  It lists every other file (except
``manifest.sig``) with its sha256 and size, so a signature over its exact bytes covers the
whole package.  It is written as canonical JSON (sorted keys, no spaces), so the same
content always gives the same bytes.

Format versions: v1, the first; v2 (2026-11) lets graph.json carry what a v1 engine would
silently ignore and so compute wrong results with (FusedAttention's ``views``,
``out_view`` and ``q_log2e``, FusedConv's residual input).  Writers stamp the newest; the
engine reads every version up to its own (engine/format.py) and refuses newer ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.package.digest import bytes_sha256, file_sha256

FORMAT = "ferry-package"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
GRAPH = "graph.json"
WEIGHTS = "weights.bin"


def canonical_json(value: Any) -> bytes:
    """JSON bytes that are the same for the same value (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def file_entry(path: str, data: bytes | Path) -> dict[str, Any]:
    """A manifest's line for one file: its name, sha256 and size.  ``data``: its bytes, or the
    file holding them (read in blocks: a model's weights may be several GB)."""
    if isinstance(data, Path):
        return {"path": path, "sha256": file_sha256(data), "size": data.stat().st_size}
    return {"path": path, "sha256": bytes_sha256(data), "size": len(data)}


@dataclass(frozen=True)
class Manifest:
    """What the writer puts in manifest.json.  Readers get the verified JSON as a dict (the
    agent and the engine read fields a newer writer may add)."""

    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    files: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)
    graph: str = GRAPH
    weights: str = WEIGHTS
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @classmethod
    def listing(
        cls,
        files: list[tuple[str, bytes | Path]],
        *,
        inputs: list[dict[str, Any]],
        outputs: list[dict[str, Any]],
        metadata: dict[str, Any] | None = None,
    ) -> Manifest:
        """The manifest of these files, in this order (the archive's order after the signature)."""
        return cls(
            inputs=inputs,
            outputs=outputs,
            files=[file_entry(name, data) for name, data in files],
            metadata=metadata or {},
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "format_version": self.format_version,
            "graph": self.graph,
            "weights": self.weights,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "files": self.files,
            "metadata": self.metadata,
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_dict())


def listed_files(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The files a (verified) manifest lists, by name."""
    return {entry["path"]: entry for entry in manifest.get("files", [])}


def read_unpacked(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a package unpacked by deploy.package.verify (verified when it was unpacked)."""
    return json.loads((Path(directory) / MANIFEST).read_bytes())
