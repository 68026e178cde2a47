"""A Ferry LLM package's files, and loading one (weights memory-mapped, nothing copied).

Files (all at the package's top level):
- ``llm.json``: the runtime's config (``LlmConfig``), the precision, and the index of
  ``weights.bin``: each array's dtype, shape and byte offset (64-byte aligned), and each
  matrix's kind and block;
- ``weights.bin``: the arrays, laid out for the kernels (q/k/v rows in one matrix, gate/up in
  another, int4 nibbles re-laid per block and rows grouped by four: engine/llm/gemv.py);
- ``tokenizer.json``, ``tokenizer_config.json`` (chat template), ``generation.json`` (sampling
  defaults), ``sample.txt`` (the accuracy report's text), ``accuracy.json``.
The manifest's metadata says ``kind: "llm"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engine.llm.config import LlmConfig
from engine.llm.errors import CheckpointError
from engine.llm.model import Layer, LlmModel, LlmWeights
from engine.llm.weights import Matrix

INDEX = "llm.json"
WEIGHTS = "weights.bin"
GENERATION = "generation.json"
ALIGN = 64
KIND = "llm"
ALLOWED_DTYPES = ("<f4", "<f2", "|i1", "|u1")


def _matrices(weights: LlmWeights) -> Iterator[tuple[str, Matrix]]:
    yield "embed", weights.embed
    if weights.lm_head is not weights.embed:
        yield "lm_head", weights.lm_head
    for i, layer in enumerate(weights.layers):
        for name in ("qkv", "o", "gate_up", "down"):
            yield f"layers.{i}.{name}", getattr(layer, name)


def _vectors(weights: LlmWeights) -> Iterator[tuple[str, np.ndarray]]:
    yield "norm", weights.norm
    for i, layer in enumerate(weights.layers):
        for name in ("input_norm", "post_norm", "qkv_bias", "o_bias"):
            value = getattr(layer, name)
            if value is not None:
                yield f"layers.{i}.{name}", value


def serialize(config: LlmConfig, weights: LlmWeights, precision: str, block: int) -> tuple[bytes, bytes]:
    """(llm.json, weights.bin) for these weights."""
    tensors: dict[str, dict[str, Any]] = {}
    chunks: list[bytes] = []
    offset = 0

    def put(name: str, array: np.ndarray) -> None:
        nonlocal offset
        pad = -offset % ALIGN
        chunks.append(b"\0" * pad)
        offset += pad
        data = np.ascontiguousarray(array).tobytes()
        tensors[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        chunks.append(data)
        offset += len(data)

    matrices = {}
    for name, matrix in _matrices(weights):
        matrices[name] = {"kind": matrix.kind, "shape": list(matrix.shape), "block": matrix.block}
        if matrix.group != 1:
            matrices[name]["group"] = matrix.group
        if matrix.activations != "float":
            matrices[name]["activations"] = matrix.activations
        for part, array in matrix.arrays.items():
            put(f"{name}.{part}", array)
    for name, vector in _vectors(weights):
        put(name, vector)
    index = {
        "config": config.to_dict(),
        "precision": precision,
        "block": block,
        "matrices": matrices,
        "tensors": tensors,
    }
    return json.dumps(index, sort_keys=True, indent=1).encode(), b"".join(chunks)


def load_weights(directory: str | Path) -> tuple[LlmConfig, LlmWeights, dict[str, Any]]:
    """The config, the weights (views into the mapped weights.bin) and the index of a package."""
    directory = Path(directory)
    try:
        index = json.loads((directory / INDEX).read_text(encoding="utf-8"))
        config = LlmConfig.from_dict(index["config"])
        data = np.memmap(directory / WEIGHTS, dtype=np.uint8, mode="r")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{directory}: not a readable Ferry LLM package ({exc})") from exc
    if not isinstance(index.get("tensors"), dict) or not isinstance(index.get("matrices"), dict):
        raise CheckpointError(f"{directory / INDEX}: needs 'tensors' and 'matrices' objects")

    def tensor(name: str) -> np.ndarray:
        entry = index["tensors"].get(name)
        if entry is None:
            raise CheckpointError(f"{directory / INDEX}: tensor {name!r} is not listed")
        try:
            dtype, shape, offset = (
                np.dtype(entry["dtype"]),
                [int(d) for d in entry["shape"]],
                int(entry["offset"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{directory / INDEX}: tensor {name!r} has a malformed entry ({exc})"
            ) from exc
        count = int(np.prod(shape, dtype=np.int64))
        if (
            offset < 0
            or offset % dtype.itemsize
            or min(shape, default=0) < 0
            or dtype.str not in ALLOWED_DTYPES
        ):
            raise CheckpointError(f"{directory / INDEX}: tensor {name!r} has a bad offset, shape or dtype")
        end = offset + count * dtype.itemsize
        if end > data.size:
            raise CheckpointError(f"{directory / WEIGHTS}: tensor {name!r} runs past the end (truncated?)")
        return data[offset:end].view(dtype).reshape(shape)

    shapes = matrix_shapes(config)

    def matrix(name: str) -> Matrix:
        spec = index["matrices"].get(name)
        if not isinstance(spec, dict) or name not in shapes:
            raise CheckpointError(f"{directory / INDEX}: matrix {name!r} is missing or unexpected")
        parts = ("w",) if spec.get("kind") in ("fp32", "fp16") else ("q", "scale")
        arrays = {p: tensor(f"{name}.{p}") for p in parts}
        found = Matrix(
            spec.get("kind"),
            tuple(spec.get("shape", ())),
            arrays,
            block=spec.get("block", 0),
            group=spec.get("group", 1),
            activations=spec.get("activations", "float"),
        )
        try:
            found.check(name, shapes[name])
        except ValueError as exc:
            raise CheckpointError(f"{directory / INDEX}: {exc}") from exc
        return found

    def vector(name: str, size: int, required: bool = True) -> np.ndarray | None:
        if not required:
            return None
        found = tensor(name)
        if found.shape != (size,) or found.dtype != np.float32:
            raise CheckpointError(
                f"{directory / INDEX}: {name} is {found.dtype}{list(found.shape)}, wants float32[{size}]"
            )
        return found

    h, qkv_rows = config.hidden_size, (config.num_heads + 2 * config.num_kv_heads) * config.head_dim

    embed = matrix("embed")
    layers = [
        Layer(
            input_norm=vector(f"layers.{i}.input_norm", h),
            post_norm=vector(f"layers.{i}.post_norm", h),
            qkv=matrix(f"layers.{i}.qkv"),
            qkv_bias=vector(f"layers.{i}.qkv_bias", qkv_rows, config.qkv_bias),
            o=matrix(f"layers.{i}.o"),
            o_bias=vector(f"layers.{i}.o_bias", h, config.o_bias),
            gate_up=matrix(f"layers.{i}.gate_up"),
            down=matrix(f"layers.{i}.down"),
        )
        for i in range(config.num_layers)
    ]
    head = embed if config.tie_word_embeddings else matrix("lm_head")
    return config, LlmWeights(embed=embed, lm_head=head, norm=vector("norm", h), layers=layers), index


def matrix_shapes(config: LlmConfig) -> dict[str, tuple[int, int]]:
    """Every matrix a package of this config holds, by name, as [N, K]."""
    h, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"embed": (config.vocab_size, h)}
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        shapes |= {
            f"layers.{i}.qkv": (q + 2 * kv, h),
            f"layers.{i}.o": (h, q),
            f"layers.{i}.gate_up": (2 * inter, h),
            f"layers.{i}.down": (h, inter),
        }
    return shapes


def load_model(directory: str | Path) -> LlmModel:
    """The runnable model of an unpacked LLM package."""
    config, weights, _ = load_weights(directory)
    return LlmModel(config, weights)
