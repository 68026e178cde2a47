"""``convert_lora``: a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) into a
Ferry adapter package bound to its base LLM package (engine/llm/lora.py has the layout).

Accepted: ``peft_type`` LORA on the decoder layers' q/k/v/o and gate/up/down projections, any
rank, ``lora_alpha`` with or without rsLoRA, no bias, no DoRA, no ``modules_to_save`` (those
change base weights, which an adapter package never carries).  Every A/B pair is checked
against the base's shapes and named when it does not fit; nothing is written on a refusal.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ConversionError, InvalidModelError
from deploy.package import MANIFEST, Manifest
from deploy.package.writer import write_archive
from engine.llm.config import LlmConfig
from engine.llm.errors import LlmError
from engine.llm.lora import (
    ADAPTER_INDEX,
    ADAPTER_KIND,
    ADAPTER_WEIGHTS,
    PROJECTIONS,
    base_digest,
    fuse,
    projection_shape,
    serialize_adapter,
)
from engine.llm.package import INDEX, KIND
from engine.llm.safetensors import SafetensorsFile

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_MODEL = "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A(.default).weight
KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$"
)


@dataclass
class LoraConversionReport:
    source: str
    base: str
    base_digest: str
    rank: int
    scaling: float
    targets: list[str]
    adapter_bytes: int
    package_size: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_base(base: str | os.PathLike[str]) -> tuple[dict[str, Any], LlmConfig]:
    """The base LLM package's manifest and config, from its archive or unpacked directory."""
    path = Path(base)
    try:
        if path.is_dir():
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            index = json.loads((path / INDEX).read_text(encoding="utf-8"))
        else:
            with tarfile.open(path, "r:*") as tar:
                manifest = json.loads(_member(tar, MANIFEST))
                index = json.loads(_member(tar, INDEX))
        config = LlmConfig.from_dict(index["config"])
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as exc:
        raise ConversionError(f"{path}: not a readable Ferry LLM package ({exc})") from exc
    if (manifest.get("metadata") or {}).get("kind") != KIND:
        raise ConversionError(f"{path}: not an LLM package (metadata.kind is not 'llm')")
    return manifest, config


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    reader = tar.extractfile(name)
    if reader is None:
        raise ValueError(f"{name} is not a regular file")
    return reader.read()


def read_peft_config(source: Path) -> tuple[int, float, list[str]]:
    """(rank, scaling, target modules) from adapter_config.json, refusing what cannot apply."""
    path = source / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise InvalidModelError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    for field, allowed in (
        ("bias", (None, "none")),
        ("use_dora", (None, False)),
        ("fan_in_fan_out", (None, False)),
    ):
        if config.get(field) not in allowed:
            raise InvalidModelError(
                f"{path}: {field}={config.get(field)!r} is not supported (only {allowed[-1]!r})"
            )
    if config.get("modules_to_save"):
        raise InvalidModelError(
            f"{path}: modules_to_save {config['modules_to_save']} changes base weights; an adapter "
            "package carries only low-rank deltas"
        )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        raise InvalidModelError(f"{path}: needs an integer r >= 1 and a number lora_alpha")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise InvalidModelError(f"{path}: rank_pattern/alpha_pattern are not supported")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    return rank, float(scaling), targets


def read_pairs(
    source: Path, config: LlmConfig
) -> tuple[list[dict[str, tuple[np.ndarray, np.ndarray]]], list[str]]:
    """Per layer, each adapted projection's (A, B) as float32, checked against the base's shapes."""
    try:
        weights = SafetensorsFile(source / ADAPTER_MODEL)
    except LlmError as exc:
        raise InvalidModelError(f"{source / ADAPTER_MODEL}: {exc}") from exc
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for name in weights.names():
        match = KEY.match(name)
        if match is None or match.group(2) not in PROJECTIONS:
            raise InvalidModelError(
                f"{ADAPTER_MODEL}: tensor {name!r} is not a LoRA A/B of a decoder layer's "
                f"{', '.join(PROJECTIONS)}; embedding/LM-head adapters are not supported"
            )
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        if layer >= config.num_layers:
            raise InvalidModelError(
                f"{ADAPTER_MODEL}: tensor {name!r} is past the base's {config.num_layers} layers"
            )
        halves.setdefault((layer, module), {})[half] = np.asarray(weights.tensor(name), np.float32)
    pairs: list[dict[str, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(config.num_layers)]
    for (layer, module), found in sorted(halves.items()):
        where = f"model.layers.{layer}.{module}"
        if set(found) != {"A", "B"}:
            raise InvalidModelError(f"{ADAPTER_MODEL}: {where} has lora_{''.join(found)} without its pair")
        a, b = found["A"], found["B"]
        n, k = projection_shape(config, module)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != k or b.shape[0] != n or a.shape[0] != b.shape[1]:
            raise InvalidModelError(
                f"{ADAPTER_MODEL}: {where} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; "
                f"the base's {module} is [{n}, {k}] (wants A [r, {k}], B [{n}, r])"
            )
        pairs[layer][module] = (a, b)
    if not any(pairs):
        raise InvalidModelError(f"{ADAPTER_MODEL}: no LoRA tensors")
    return pairs, sorted({m for layer in pairs for m in layer})


def convert_lora(
    source: str | os.PathLike[str], base: str | os.PathLike[str], dst: str | os.PathLike[str]
) -> LoraConversionReport:
    """Convert the PEFT adapter directory ``source`` for the LLM package ``base`` into ``dst``."""
    started = time.perf_counter()
    source, dst = Path(source), Path(dst)
    if not source.is_dir():
        raise ConversionError(f"{source}: not an adapter directory ({ADAPTER_CONFIG} + {ADAPTER_MODEL})")
    if not dst.parent.is_dir() or dst.is_dir():
        raise ConversionError(f"{dst}: give a file path in an existing directory for the adapter package")
    manifest, config = read_base(base)
    try:
        digest = base_digest(manifest)
    except LlmError as exc:
        raise ConversionError(f"{base}: {exc}") from exc
    rank, scaling, _ = read_peft_config(source)
    pairs, targets = read_pairs(source, config)
    layers = [fuse(config, layer, scaling) for layer in pairs]
    header = {
        "base_digest": digest,
        "num_layers": config.num_layers,
        "rank": rank,
        "scaling": scaling,
        "targets": targets,
    }
    index, data = serialize_adapter(layers, header)
    files = [(ADAPTER_INDEX, index), (ADAPTER_WEIGHTS, data)]
    metadata = {"kind": ADAPTER_KIND, "adapter": header | {"base_model_type": config.model_type}}
    listing = Manifest.listing(files, inputs=[], outputs=[], metadata=metadata)
    try:
        manifest_bytes = dataclasses.replace(listing, graph=ADAPTER_INDEX, weights=ADAPTER_WEIGHTS).to_bytes()
        write_archive(dst, [(MANIFEST, manifest_bytes), *files])
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot write the package ({exc.strerror or exc})") from exc
    finally:
        Path(str(dst) + ".tmp").unlink(missing_ok=True)
    return LoraConversionReport(
        source=str(source),
        base=str(base),
        base_digest=digest,
        rank=rank,
        scaling=scaling,
        targets=targets,
        adapter_bytes=len(data),
        package_size=dst.stat().st_size,
        seconds=time.perf_counter() - started,
    )
