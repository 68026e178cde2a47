"""Tiny Llama-family checkpoints built with numpy and written as safetensors (by this module's own
writer, not the engine's reader), a byte-level BPE tokenizer trained here, and an independent
plain-numpy forward written from the model's equations (no cache, one head at a time), and
PEFT LoRA adapters with the weights they merge into."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

TEXT = (
    "The ferry leaves the harbour at dawn and crosses the grey water to the island. "
    "Passengers drink tea, read the news and watch the gulls follow the boat. "
    "On the island the road climbs past the lighthouse to a village of white houses. "
    "In the evening the ferry returns, its lights reflected in the calm sea. "
) * 4

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """The format by hand: 8-byte header length, JSON header, raw little-endian data."""
    numpy_dtype = {"F32": "<f4", "F16": "<f2"}[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks, offset = [], 0
    for name, value in tensors.items():
        data = np.ascontiguousarray(value, dtype=numpy_dtype).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))


def config_dict(model_type: str = "llama", vocab: int = 256, **extra: Any) -> dict[str, Any]:
    config = {"model_type": model_type, "architectures": ["X"], "vocab_size": vocab, **SMALL}
    config["tie_word_embeddings"] = model_type == "qwen2"
    config.update(extra)
    return config


def random_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Weights with the config's shapes, scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim", h // heads)

    def mat(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)

    t = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, h)).astype(np.float32),
        "model.norm.weight": norm(),
    }
    if not config.get("tie_word_embeddings"):
        t["lm_head.weight"] = mat(vocab, h)
    bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = mat(heads * d, h)
        t[p + "self_attn.k_proj.weight"] = mat(kv * d, h)
        t[p + "self_attn.v_proj.weight"] = mat(kv * d, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, heads * d)
        t[p + "mlp.gate_proj.weight"] = mat(inter, h)
        t[p + "mlp.up_proj.weight"] = mat(inter, h)
        t[p + "mlp.down_proj.weight"] = mat(h, inter)
        t[p + "input_layernorm.weight"] = norm()
        t[p + "post_attention_layernorm.weight"] = norm()
        if bias:
            for n, size in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
                t[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(size)).astype(np.float32)
        if config.get("attention_bias") and config["model_type"] != "qwen2":
            t[p + "self_attn.o_proj.bias"] = (0.1 * rng.standard_normal(h)).astype(np.float32)
    return t


def train_tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TEXT], trainer=trainer)
    return tokenizer


def write_checkpoint(
    directory: Path, model_type: str = "llama", seed: int = 0, shards: int = 1, **extra: Any
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A whole checkpoint directory: config, shards, tokenizer files, generation config."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(320)
    vocab = extra.pop("vocab_size", tokenizer.get_vocab_size())
    config = config_dict(model_type, vocab=vocab, bos_token_id=0, eos_token_id=0, **extra)
    tensors = random_tensors(config, seed)
    (directory / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    for index in range(shards):
        part = {n: tensors[n] for n in names[index::shards]}
        write_safetensors(directory / f"model-{index + 1:05d}-of-{shards:05d}.safetensors", part)
    tokenizer.save(str(directory / "tokenizer.json"))
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "<|endoftext|>"})
    )
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "temperature": 0.7}))
    return config, tensors


def reference_logits(config: dict[str, Any], t: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """Logits at every position, from the equations, in float64, one head at a time, no cache."""
    h, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim", h // heads)
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    n = len(tokens)
    w = {k: v.astype(np.float64) for k, v in t.items()}

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * g

    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "linear":
        inv = inv / scaling["factor"]
    angle = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([angle, angle], 1)), np.sin(np.concatenate([angle, angle], 1))

    def rope(x: np.ndarray) -> np.ndarray:  # x [n, d]
        rotated = np.concatenate([-x[:, d // 2 :], x[:, : d // 2]], axis=1)
        return x * cos + rotated * sin

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."

        def lin(name: str, v: np.ndarray, p: str = p) -> np.ndarray:
            out = v @ w[p + name + ".weight"].T
            return out + w[p + name + ".bias"] if p + name + ".bias" in w else out

        a = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = lin("self_attn.q_proj", a), lin("self_attn.k_proj", a), lin("self_attn.v_proj", a)
        heads_out = []
        for head in range(heads):
            g = head // (heads // kv)
            qh = rope(q[:, head * d : (head + 1) * d])
            kh = rope(k[:, g * d : (g + 1) * d])
            vh = v[:, g * d : (g + 1) * d]
            s = qh @ kh.T / np.sqrt(d)
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            heads_out.append((e / e.sum(axis=1, keepdims=True)) @ vh)
        x = x + lin("self_attn.o_proj", np.concatenate(heads_out, axis=1))
        b = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = lin("mlp.gate_proj", b)
        x = x + lin("mlp.down_proj", gate / (1 + np.exp(-gate)) * lin("mlp.up_proj", b))
    head_w = w["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms(x, w["model.norm.weight"]) @ head_w.T


LORA_TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_peft(
    directory: Path, config: dict, seed: int = 1, rank: int = 4, alpha: float = 8.0, **extra: object
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A PEFT adapter directory (PEFT's key names); returns {hf weight name: (A, B)}."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, inter = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * (h // config["num_attention_heads"])
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    shapes = {
        "self_attn.q_proj": (q, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (inter, h),
        "mlp.up_proj": (inter, h),
        "mlp.down_proj": (h, inter),
    }
    pairs, tensors = {}, {}
    for i in range(config["num_hidden_layers"]):
        for module, (n, k) in shapes.items():
            a = (rng.standard_normal((rank, k)) / np.sqrt(k)).astype(np.float32)
            b = (0.3 * rng.standard_normal((n, rank))).astype(np.float32)
            key = f"base_model.model.model.layers.{i}.{module}"
            tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
            pairs[f"model.layers.{i}.{module}.weight"] = (a, b)
    write_safetensors(directory / "adapter_model.safetensors", tensors)
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(LORA_TARGETS),
        "bias": "none",
        "modules_to_save": None,
        **extra,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config))
    return pairs


def merged(tensors: dict, pairs: dict, scaling: float) -> dict:
    out = dict(tensors)
    for name, (a, b) in pairs.items():
        out[name] = (tensors[name].astype(np.float64) + scaling * (b.astype(np.float64) @ a)).astype(
            np.float32
        )
    return out
