"""Checkpoints the runtime refuses, each with the field or tensor named."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from engine.llm.checkpoint import load_checkpoint
from engine.llm.config import parse_config
from engine.llm.errors import CheckpointError, UnsupportedModelError
from engine.llm.safetensors import SafetensorsFile
from tests.engine.llm.checkpoints import config_dict, write_checkpoint, write_safetensors


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type='gpt2' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"mlp_bias": True}, "mlp_bias=true"),
        ({"num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling.rope_type='yarn' is not supported",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
        ({"rope_scaling": {"rope_type": "linear"}}, "factor=None must be a positive number"),
        ({"hidden_size": -4}, "hidden_size=-4 must be a positive integer"),
        ({"vocab_size": "big"}, "vocab_size='big'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type='yarn' is not supported"),
        ({"rope_parameters": {"full_attention": {}}}, "per-layer-type RoPE is not supported"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(change: dict, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config({**config_dict(), **change})


def test_supported_scalings_and_windows_are_read() -> None:
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = parse_config(config_dict(rope_scaling={**llama3, "original_max_position_embeddings": 8192}))
    plain = parse_config(config_dict())
    assert config.inv_freq()[0] == plain.inv_freq()[0]  # high frequencies are kept
    assert config.inv_freq()[-1] == pytest.approx(plain.inv_freq()[-1] / 8.0)  # low ones scaled
    assert parse_config(config_dict("mistral", sliding_window=16)).max_positions == 16
    assert parse_config(config_dict("qwen2", sliding_window=16, use_sliding_window=False)).max_positions == 64


def test_transformers_5_rope_parameters_are_read_like_rope_theta_and_rope_scaling() -> None:
    """transformers 5 writes ``rope_parameters`` instead of ``rope_theta``/``rope_scaling``."""
    new = parse_config(config_dict(rope_parameters={"rope_theta": 5e5, "rope_type": "default"}))
    old = parse_config(config_dict(rope_theta=5e5))
    assert new.rope_theta == old.rope_theta == 5e5 and new.rope_scaling is None
    scaled = {"rope_theta": 5e5, "rope_type": "linear", "factor": 2.0}
    assert parse_config(config_dict(rope_parameters=scaled)).rope_scaling == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    np.testing.assert_array_equal(
        parse_config(config_dict(rope_parameters=scaled)).inv_freq(),
        parse_config(
            config_dict(rope_theta=5e5, rope_scaling={"rope_type": "linear", "factor": 2.0})
        ).inv_freq(),
    )


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    config, tensors = write_checkpoint(tmp_path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    for shard in tmp_path.glob("*.safetensors"):
        shard.unlink()
    write_safetensors(tmp_path / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.up_proj.weight' is missing"):
        load_checkpoint(tmp_path)


def test_a_wrongly_shaped_tensor_is_named(tmp_path: Path) -> None:
    config, tensors = write_checkpoint(tmp_path, shards=1)
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 64), np.float32)
    write_safetensors(next(tmp_path.glob("*.safetensors")), tensors)
    with pytest.raises(
        CheckpointError, match=r"k_proj.weight' .* has shape \[8, 64\], config.json implies \[32, 64\]"
    ):
        load_checkpoint(tmp_path)


def test_a_truncated_shard_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, shards=1)
    shard = next(tmp_path.glob("*.safetensors"))
    header_length = struct.unpack("<Q", shard.read_bytes()[:8])[0]
    last = list(json.loads(shard.read_bytes()[8 : 8 + header_length]))[-1]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=f"tensor '{last}' runs past the end of the file"):
        load_checkpoint(tmp_path)


def test_garbage_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config_dict()))
    with pytest.raises(CheckpointError, match="no \\*.safetensors weights"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(CheckpointError, match="header length .* runs past the file"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(CheckpointError, match="header is not JSON"):
        load_checkpoint(tmp_path)


def test_float16_and_bfloat16_tensors_read_as_stored(tmp_path: Path) -> None:
    values = np.array([[1.5, -2.25], [0.0, 3.0]], np.float32)
    write_safetensors(tmp_path / "a.safetensors", {"x": values}, dtype="F16")
    half = SafetensorsFile(tmp_path / "a.safetensors").tensor("x")
    assert half.dtype == np.float16 and np.array_equal(half, values)
    header = json.dumps({"y": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    bf16 = (values[0].view(np.uint32) >> 16).astype("<u2").tobytes()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bf16)
    assert SafetensorsFile(tmp_path / "b.safetensors").tensor("y").tolist() == [1.5, -2.25]
