"""A Hugging Face checkpoint directory: config.json plus *.safetensors shards, every tensor the
config implies checked for presence and shape (the message names the tensor) before use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.llm.config import LlmConfig, read_config
from engine.llm.errors import CheckpointError
from engine.llm.safetensors import SafetensorsFile

# The per-layer tensors, their names under ``model.layers.{i}.``
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")


def expected_shapes(config: LlmConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, by its Hugging Face name, with its shape."""
    h, q, kv, inter = (
        config.hidden_size,
        config.num_heads * config.head_dim,
        config.num_kv_heads * config.head_dim,
        config.intermediate_size,
    )
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if config.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,)}
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        if config.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
    return shapes


@dataclass
class Checkpoint:
    """A checked checkpoint: its config and every tensor (memory-mapped, float16/32 as stored)."""

    directory: Path
    config: LlmConfig
    tensors: dict[str, np.ndarray]

    def size_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Read and check a checkpoint directory; raise ``CheckpointError`` naming what is wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a checkpoint directory")
    config = read_config(directory)
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(
            f"{directory}: no *.safetensors weights (pytorch_model.bin is not read: no torch)"
        )
    found: dict[str, tuple[SafetensorsFile, str]] = {}
    for shard in shards:
        mapped = SafetensorsFile(shard)
        for name in mapped.names():
            if name in found:
                raise CheckpointError(
                    f"tensor {name!r} is in both {found[name][0].path.name} and {shard.name}"
                )
            found[name] = (mapped, name)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(config).items():
        if name not in found:
            raise CheckpointError(
                f"tensor {name!r} is missing from the checkpoint (config.json implies {shape})"
            )
        mapped, _ = found[name]
        if mapped.shape(name) != shape:
            raise CheckpointError(
                f"tensor {name!r} in {mapped.path.name} has shape {list(mapped.shape(name))}, "
                f"config.json implies {list(shape)}"
            )
        tensors[name] = mapped.tensor(name)
    return Checkpoint(directory=directory, config=config, tensors=tensors)
