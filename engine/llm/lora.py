"""LoRA adapters applied at run time as a low-rank add beside the (quantized) base weights.

A PEFT LoRA on a Linear W [N, K] adds ``scaling * B @ A`` (A [r, K], B [N, r]; scaling is
lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA).  The base is never re-quantized: for
inputs x [M, K] the layer's output gets ``(x @ A.T) @ (scaling * B).T`` added, two thin
matmuls (rank r) beside the base GEMV.  Because the runtime fuses q/k/v into one matrix and
gate/up into another (model.py), an adapter's A matrices of one fused matrix are stacked
([r_q + r_k + r_v, K]) and its B matrices placed block-diagonally into the fused output rows
([N_fused, r_total], zero where a projection is not adapted): one pair of matmuls per fused
matrix and layer.

An adapter package (``kind: "llm-adapter"``) holds ``adapter.json`` (rank, scaling, the
adapted projections, the arrays' index into ``adapter.bin``, and ``base_digest``) and
``adapter.bin`` (float32 A and pre-scaled B per layer and fused matrix).  ``base_digest``
binds it to its base package: the sha256 of the base's llm.json and weights.bin entries in
the base's manifest (``base_digest``), which signing and re-packing leave unchanged; loading
against another base is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.llm.config import LlmConfig
from engine.llm.errors import CheckpointError

ADAPTER_INDEX = "adapter.json"
ADAPTER_WEIGHTS = "adapter.bin"
ADAPTER_KIND = "llm-adapter"
FUSED = ("qkv", "o", "gate_up", "down")
# PEFT's module name -> (fused matrix, the part of its output rows)
PROJECTIONS = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}


class AdapterError(CheckpointError):
    """An adapter that does not fit its base, or a malformed adapter package (names what)."""


@dataclass
class LowRank:
    """One fused matrix's delta: out += (x @ a.T) @ b.T."""

    a: np.ndarray  # [r_total, K] float32
    b: np.ndarray  # [N, r_total] float32, scaling applied

    def add_to(self, out: np.ndarray, x: np.ndarray) -> np.ndarray:
        return out + (x @ self.a.T) @ self.b.T


@dataclass
class LoraAdapter:
    """Per layer, the fused matrices this adapter changes (absent: unchanged)."""

    name: str
    rank: int
    layers: list[dict[str, LowRank]]
    base_digest: str = ""

    @property
    def nbytes(self) -> int:
        return sum(d.a.nbytes + d.b.nbytes for layer in self.layers for d in layer.values())


def fused_rows(config: LlmConfig) -> dict[str, list[int]]:
    """Each fused matrix's output-row split, in PROJECTIONS' part order."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "qkv": [q, kv, kv],
        "o": [config.hidden_size],
        "gate_up": [config.intermediate_size, config.intermediate_size],
        "down": [config.hidden_size],
    }


def projection_shape(config: LlmConfig, module: str) -> tuple[int, int]:
    """[N, K] of a PEFT target module (q_proj, ..., down_proj) in this config."""
    fused, part = PROJECTIONS[module]
    rows = fused_rows(config)[fused][part]
    h, q = config.hidden_size, config.num_heads * config.head_dim
    inputs = {"qkv": h, "o": q, "gate_up": h, "down": config.intermediate_size}[fused]
    return rows, inputs


def fuse(
    config: LlmConfig, pairs: dict[str, tuple[np.ndarray, np.ndarray]], scaling: float
) -> dict[str, LowRank]:
    """One layer's per-projection (A, B) pairs as one ``LowRank`` per fused matrix."""
    found: dict[str, LowRank] = {}
    splits = fused_rows(config)
    for fused in FUSED:
        parts = [(m, pairs[m]) for m in PROJECTIONS if PROJECTIONS[m][0] == fused and m in pairs]
        if not parts:
            continue
        total = sum(a.shape[0] for _, (a, _) in parts)
        rows = splits[fused]
        b = np.zeros((sum(rows), total), np.float32)
        a_rows, column = [], 0
        for module, (a, lora_b) in parts:
            start = sum(rows[: PROJECTIONS[module][1]])
            b[start : start + lora_b.shape[0], column : column + a.shape[0]] = lora_b * scaling
            a_rows.append(np.asarray(a, np.float32))
            column += a.shape[0]
        found[fused] = LowRank(a=np.ascontiguousarray(np.concatenate(a_rows)), b=b)
    return found


def base_digest(manifest: dict[str, Any]) -> str:
    """The identity of an LLM package's weights: sha256 over its manifest's entries for llm.json
    and weights.bin (unchanged by signing; changed by any other conversion)."""
    entries = {e.get("path"): e for e in manifest.get("files", []) if isinstance(e, dict)}
    wanted = ("llm.json", "weights.bin")
    if not all(isinstance(entries.get(name, {}).get("sha256"), str) for name in wanted):
        raise AdapterError("the base package's manifest does not list llm.json and weights.bin")
    text = "".join(f"{name}:{entries[name]['sha256']}\n" for name in wanted)
    return hashlib.sha256(text.encode()).hexdigest()


def serialize_adapter(
    adapter_layers: list[dict[str, LowRank]], header: dict[str, Any]
) -> tuple[bytes, bytes]:
    """(adapter.json, adapter.bin): ``header`` plus the arrays' index."""
    tensors: dict[str, dict[str, Any]] = {}
    chunks: list[bytes] = []
    offset = 0
    for i, layer in enumerate(adapter_layers):
        for fused, delta in layer.items():
            for part, array in (("a", delta.a), ("b", delta.b)):
                pad = -offset % 64
                chunks.append(b"\0" * pad)
                offset += pad
                data = np.ascontiguousarray(array, np.float32).tobytes()
                tensors[f"layers.{i}.{fused}.{part}"] = {"shape": list(array.shape), "offset": offset}
                chunks.append(data)
                offset += len(data)
    index = dict(header, tensors=tensors, dtype="<f4")
    return json.dumps(index, sort_keys=True, indent=1).encode(), b"".join(chunks)


def load_adapter(
    directory: str | Path, config: LlmConfig, name: str = "", expected_base: str | None = None
) -> LoraAdapter:
    """An unpacked adapter package, checked against the base's config (and its digest when
    ``expected_base`` is given)."""
    directory = Path(directory)
    try:
        index = json.loads((directory / ADAPTER_INDEX).read_text(encoding="utf-8"))
        data = np.fromfile(directory / ADAPTER_WEIGHTS, dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{directory}: not a readable Ferry adapter package ({exc})") from exc
    if not isinstance(index, dict) or not isinstance(index.get("tensors"), dict):
        raise AdapterError(f"{directory / ADAPTER_INDEX}: needs a 'tensors' object")
    digest = str(index.get("base_digest", ""))
    if expected_base is not None and digest != expected_base:
        raise AdapterError(
            f"{directory}: adapter made for base {digest[:12] or '?'}, "
            f"this model is {expected_base[:12]}; convert it against this base"
        )
    if index.get("num_layers") != config.num_layers:
        raise AdapterError(
            f"{directory}: adapter has {index.get('num_layers')} layers, the base {config.num_layers}"
        )
    layers = [_layer(directory, index["tensors"], data, config, i) for i in range(config.num_layers)]
    return LoraAdapter(
        name=name or directory.name, rank=int(index.get("rank", 0)), layers=layers, base_digest=digest
    )


def _layer(
    directory: Path, tensors: dict[str, Any], data: np.ndarray, config: LlmConfig, i: int
) -> dict[str, LowRank]:
    found: dict[str, LowRank] = {}
    splits = fused_rows(config)
    for fused in FUSED:
        a_entry, b_entry = tensors.get(f"layers.{i}.{fused}.a"), tensors.get(f"layers.{i}.{fused}.b")
        if a_entry is None and b_entry is None:
            continue
        a, b = _array(directory, a_entry, data), _array(directory, b_entry, data)
        k = projection_shape(config, next(m for m in PROJECTIONS if PROJECTIONS[m][0] == fused))[1]
        if a.ndim != 2 or b.ndim != 2 or a.shape != (b.shape[1], k) or b.shape[0] != sum(splits[fused]):
            raise AdapterError(
                f"{directory}: layers.{i}.{fused} is A{list(a.shape)} B{list(b.shape)}, "
                f"the base wants A[r, {k}] B[{sum(splits[fused])}, r]"
            )
        found[fused] = LowRank(a=a, b=b)
    return found


def _array(directory: Path, entry: Any, data: np.ndarray) -> np.ndarray:
    try:
        shape, offset = [int(d) for d in entry["shape"]], int(entry["offset"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AdapterError(f"{directory / ADAPTER_INDEX}: a malformed tensor entry ({exc})") from exc
    end = offset + 4 * int(np.prod(shape, dtype=np.int64))
    if offset < 0 or offset % 4 or min(shape, default=0) < 0 or end > data.size:
        raise AdapterError(f"{directory / ADAPTER_WEIGHTS}: a tensor runs past the end (truncated?)")
    return data[offset:end].view("<f4").reshape(shape)
