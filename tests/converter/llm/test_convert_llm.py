"""`ferry convert-llm`: a tiny checkpoint into a signed LLM package that runs, with an honest
accuracy report; broken checkpoints refused naming the tensor or field, nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from converter.cli import main
from converter.errors import ConversionError
from converter.llm.accuracy import log_softmax
from converter.llm.convert import DEFAULT_TEXT, convert_llm
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from engine.llm.generate import generate
from engine.llm.package import load_model
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer
from tests.engine.llm.checkpoints import reference_logits, write_checkpoint, write_safetensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    directory = tmp_path_factory.mktemp("qwen")
    config, tensors = write_checkpoint(directory, "qwen2", max_position_embeddings=512, shards=2)
    return directory, config, tensors


def _unpack(package: Path, dest: Path) -> Path:
    keys = generate_keypair()
    signed = package.with_name(package.name + ".signed")
    sign_package(package, signed, keys.private_key)
    verify_and_unpack(signed, dest, keys.public_key)
    return dest


@pytest.mark.parametrize(
    ("weights", "block", "min_top1", "max_kl"),
    [("fp16", 32, 0.97, 1e-4), ("int8", 32, 0.9, 5e-3), ("int4", 64, 0.6, 0.1)],
)
def test_a_converted_package_runs_and_its_accuracy_report_is_honest(
    checkpoint: tuple, tmp_path: Path, weights: str, block: int, min_top1: float, max_kl: float
) -> None:
    directory, config, tensors = checkpoint
    report = convert_llm(directory, tmp_path / "m.ferry", weights=weights, block=block)
    unpacked = _unpack(tmp_path / "m.ferry", tmp_path / "unpacked")
    manifest = json.loads((unpacked / "manifest.json").read_text())
    assert manifest["metadata"]["kind"] == "llm" and manifest["graph"] == "llm.json"
    assert manifest["metadata"]["llm"]["precision"] == weights
    assert {"tokenizer.json", "tokenizer_config.json", "generation.json", "sample.txt"} <= set(report.files)
    assert "chat_template" in json.loads((unpacked / "tokenizer_config.json").read_text())
    # the tokenizer stored compact: the same document in fewer bytes
    source_tokenizer = (directory / "tokenizer.json").read_bytes()
    stored_tokenizer = (unpacked / "tokenizer.json").read_bytes()
    assert json.loads(stored_tokenizer) == json.loads(source_tokenizer)
    assert len(stored_tokenizer) < len(source_tokenizer) and b"\n" not in stored_tokenizer
    assert json.loads((unpacked / "generation.json").read_text()) == {"temperature": 0.7}
    # the report's figures, recomputed from the unpacked package against the independent reference
    model, tokenizer = load_model(unpacked), LlmTokenizer.from_directory(unpacked)
    tokens = tokenizer.encode((unpacked / "sample.txt").read_text())[: report.accuracy["tokens"]]
    assert (unpacked / "sample.txt").read_text() == DEFAULT_TEXT.read_text()
    p = log_softmax(reference_logits(config, tensors, tokens))[:-1]
    q = log_softmax(model.forward(tokens, model.new_cache(len(tokens)), all_logits=True))[:-1]
    a = report.accuracy
    assert a["top1_agreement"] == pytest.approx(np.mean(p.argmax(1) == q.argmax(1)), abs=0.01)
    assert a["mean_kl"] == pytest.approx(np.mean(np.sum(np.exp(p) * (p - q), axis=1)), rel=0.05, abs=1e-6)
    following = np.asarray(tokens[1:])
    assert a["perplexity"] == pytest.approx(np.exp(-q[np.arange(following.size), following].mean()), rel=1e-3)
    assert a["top1_agreement"] >= min_top1 and a["mean_kl"] <= max_kl
    # smaller than fp32 by the precision's ratio (embedding and head quantized too)
    fp32_bytes = sum(t.nbytes for t in tensors.values())
    ratio = {"fp16": 0.5, "int8": 0.27, "int4": 0.16}[weights]
    assert report.weights_bytes <= ratio * fp32_bytes + 4096
    # the health check's tokens regenerate on the device
    selftest = manifest["metadata"]["llm"]["selftest"]
    again = generate(
        model,
        tokenizer,
        selftest["prompt_tokens"],
        max_tokens=len(selftest["tokens"]),
        options=SamplingOptions(temperature=0),
        stop_tokens=[],
    )
    assert again.tokens == selftest["tokens"]


def test_the_cli_converts_and_prints_json(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    directory, _, _ = checkpoint
    text = tmp_path / "text.txt"
    text.write_text("The ferry crosses the grey water to the island and back again every day. " * 3)
    code = main(
        [
            "convert-llm",
            str(directory),
            "-o",
            str(tmp_path / "x.ferry"),
            "--weights",
            "int8",
            "--text",
            str(text),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["precision"] == "int8" and report["accuracy"]["tokens"] == len(
        LlmTokenizer.from_directory(directory).encode(text.read_text())
    )
    assert (tmp_path / "x.ferry").stat().st_size == report["package_size"]


def _copy(directory: Path, dest: Path) -> Path:
    dest.mkdir()
    for path in directory.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
    return dest


def _assert_refused(source: Path, tmp_path: Path, message: str) -> None:
    dst = tmp_path / "out.ferry"
    with pytest.raises(ConversionError, match=message):
        convert_llm(source, dst, weights="int4")
    assert not dst.exists() and not Path(str(dst) + ".tmp").exists()
    assert main(["convert-llm", str(source), "-o", str(dst)]) == 1


def test_a_missing_tensor_is_refused_by_name_and_nothing_is_written(
    checkpoint: tuple, tmp_path: Path
) -> None:
    directory, _, tensors = checkpoint
    broken = _copy(directory, tmp_path / "broken")
    for shard in broken.glob("*.safetensors"):
        shard.unlink()
    write_safetensors(
        broken / "model.safetensors",
        {k: v for k, v in tensors.items() if "layers.1.self_attn.v_proj.bias" not in k},
    )
    _assert_refused(broken, tmp_path, r"'model.layers.1.self_attn.v_proj.bias' is missing")


def test_a_tokenizer_larger_than_the_embedding_is_refused(checkpoint: tuple, tmp_path: Path) -> None:
    directory, config, tensors = checkpoint
    broken = _copy(directory, tmp_path / "small-vocab")
    small = {**config, "vocab_size": 200}
    (broken / "config.json").write_text(json.dumps(small))
    for shard in broken.glob("*.safetensors"):
        shard.unlink()
    write_safetensors(
        broken / "model.safetensors", {k: v[:200] if "embed" in k else v for k, v in tensors.items()}
    )
    _assert_refused(broken, tmp_path, "past the embedding's 200 rows")


def test_unsupported_rope_scaling_is_refused_naming_the_field(checkpoint: tuple, tmp_path: Path) -> None:
    directory, config, _ = checkpoint
    broken = _copy(directory, tmp_path / "yarn")
    (broken / "config.json").write_text(
        json.dumps({**config, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    )
    _assert_refused(broken, tmp_path, "rope_scaling.rope_type='yarn' is not supported")


def test_a_float16_checkpoint_converts_at_fp32_matching_the_reference(
    checkpoint: tuple, tmp_path: Path
) -> None:
    """Published checkpoints store 16-bit floats: read as stored, widened exactly."""
    directory, config, tensors = checkpoint
    half = _copy(directory, tmp_path / "half")
    for shard in half.glob("*.safetensors"):
        shard.unlink()
    write_safetensors(half / "model.safetensors", tensors, dtype="F16")
    convert_llm(half, tmp_path / "h.ferry", weights="fp32")
    model = load_model(_unpack(tmp_path / "h.ferry", tmp_path / "unpacked"))
    rounded = {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()}
    prompt = [1, 50, 99, 7, 140, 3]
    np.testing.assert_allclose(
        model.forward(prompt, model.new_cache(), all_logits=True),
        reference_logits(config, rounded, prompt),
        atol=1e-4,
        rtol=0,
    )
