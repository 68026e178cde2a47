"""A Hugging Face decoder's config.json as an ``LlmConfig``, or a clear refusal naming the field.

Supported: ``model_type`` llama, qwen2 or mistral (RMSNorm, RoPE, grouped-query attention, a
SwiGLU MLP with ``silu``, tied or untied LM head; Qwen2's q/k/v bias, Llama's
``attention_bias``).  RoPE scaling: none/``default``, ``linear`` and ``llama3``; anything else
(``dynamic``, ``yarn``, ``longrope``, ...) is refused rather than run with wrong positions.
A sliding window is honoured by capping the context length at the window (inside it, windowed
attention equals full attention).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.llm.errors import CheckpointError, UnsupportedModelError

MODEL_TYPES = ("llama", "qwen2", "mistral")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class LlmConfig:
    """What the runtime needs of a decoder; ``to_dict``/``from_dict`` round-trip it in packages."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlmConfig:
        fields = dict(data)
        fields["eos_token_ids"] = tuple(fields.get("eos_token_ids") or ())
        return cls(**fields)

    def inv_freq(self) -> np.ndarray:
        """RoPE's inverse frequencies (head_dim / 2 of them), after the scaling's adjustment."""
        exponents = np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim
        inv = 1.0 / (self.rope_theta**exponents)
        scaling = self.rope_scaling or {}
        kind = scaling.get("rope_type", "default")
        if kind == "linear":
            inv = inv / float(scaling["factor"])
        elif kind == "llama3":
            inv = _llama3_inv_freq(inv, scaling)
        return inv


def _llama3_inv_freq(inv: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling (as transformers' ``_compute_llama3_parameters``)."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, smoothed, scaled)


def read_config(directory: str | Path) -> LlmConfig:
    """config.json (and generation_config.json's eos ids, if present) of a checkpoint directory."""
    path = Path(directory) / "config.json"
    data = _json(path)
    generation = Path(directory) / "generation_config.json"
    extra = _json(generation) if generation.is_file() else {}
    return parse_config(data, generation=extra)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing (a Hugging Face checkpoint needs it)") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: must hold a JSON object")
    return data


def parse_config(data: dict[str, Any], generation: dict[str, Any] | None = None) -> LlmConfig:
    """Check config.json's fields and return the runtime's view of them."""
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedModelError(
            f"config.json model_type={model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
        )
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.json hidden_act={act!r} is not supported (SwiGLU needs 'silu')")
    if data.get("mlp_bias"):
        raise UnsupportedModelError("config.json mlp_bias=true is not supported (the MLP has no biases here)")
    hidden = _positive(data, "hidden_size")
    heads = _positive(data, "num_attention_heads")
    kv_heads = _positive(data, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise UnsupportedModelError(
            f"config.json num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        )
    head_dim = data.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise UnsupportedModelError(
                f"config.json hidden_size={hidden} is not a multiple of num_attention_heads={heads}"
            )
        head_dim = hidden // heads
    head_dim = _positive({"head_dim": head_dim}, "head_dim")
    if head_dim % 2:
        raise UnsupportedModelError(f"config.json head_dim={head_dim} must be even for RoPE")
    max_positions = _positive(data, "max_position_embeddings")
    max_positions = min(max_positions, _window(data, max_positions))
    generation = generation or {}
    rope_theta, rope_scaling = _rope(data)
    return LlmConfig(
        model_type=model_type,
        vocab_size=_positive(data, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_positive(data, "intermediate_size"),
        num_layers=_positive(data, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_positions=max_positions,
        rms_norm_eps=_number(data, "rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(data.get("attention_bias", False)),
        o_bias=model_type != "qwen2" and bool(data.get("attention_bias", False)),
        bos_token_id=_token_id(generation.get("bos_token_id", data.get("bos_token_id"))),
        eos_token_ids=_token_ids(generation.get("eos_token_id", data.get("eos_token_id"))),
    )


def _positive(data: dict[str, Any], name: str, default: int | None = None) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UnsupportedModelError(f"config.json {name}={value!r} must be a positive integer")
    return value


def _number(data: dict[str, Any], name: str, default: float) -> float:
    value = data.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UnsupportedModelError(f"config.json {name}={value!r} must be a positive number")
    return float(value)


def _window(data: dict[str, Any], max_positions: int) -> int:
    """The longest context full attention computes exactly: the sliding window, if one is used."""
    window = data.get("sliding_window")
    if window is None or data.get("use_sliding_window") is False:
        return max_positions
    return _positive(data, "sliding_window")


def _rope(data: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """RoPE's base and scaling: transformers 5 writes both into ``rope_parameters`` (read first:
    a config.json without ``rope_theta`` would otherwise run at the 10000 default, silently
    wrong positions); older configs have ``rope_theta`` and ``rope_scaling``."""
    params = data.get("rope_parameters")
    if params is None:
        return _number(data, "rope_theta", 10000.0), _rope_scaling(data.get("rope_scaling"))
    if not isinstance(params, dict) or "full_attention" in params:
        raise UnsupportedModelError(
            f"config.json rope_parameters={str(params)[:80]} must be one object (per-layer-type RoPE "
            "is not supported)"
        )
    theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
    theta = _number({"rope_parameters.rope_theta": theta}, "rope_parameters.rope_theta", 10000.0)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        return theta, None
    return theta, _rope_scaling(scaling)


def _rope_scaling(scaling: Any) -> dict[str, Any] | None:
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise UnsupportedModelError(f"config.json rope_scaling={scaling!r} must be an object or null")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"config.json rope_scaling.rope_type={kind!r} is not supported; "
            f"supported: {', '.join(ROPE_TYPES)}"
        )
    out: dict[str, Any] = {"rope_type": kind}
    needed = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
    for name in needed.get(kind, ()):
        out[name] = _number(scaling, name, None)  # type: ignore[arg-type]
    if kind == "llama3":
        out["original_max_position_embeddings"] = _positive(scaling, "original_max_position_embeddings")
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise UnsupportedModelError(
                "config.json rope_scaling.high_freq_factor must exceed low_freq_factor"
            )
    return out


def _token_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _token_ids(value: Any) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)
