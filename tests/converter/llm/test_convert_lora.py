"""`ferry convert-lora`: a PEFT LoRA adapter built here into an adapter package bound to its base;
applied at run time (a low-rank add beside the base, never re-quantized) it gives the merged
weights' logits; adapters that do not fit their base are refused naming the tensor or field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from converter.cli import main
from converter.errors import InvalidModelError
from converter.llm.accuracy import log_softmax
from converter.llm.convert import convert_llm
from converter.llm.lora import convert_lora
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from engine.llm.lora import AdapterError, base_digest, load_adapter
from engine.llm.package import load_model
from tests.engine.llm.checkpoints import (
    LORA_TARGETS as TARGETS,
)
from tests.engine.llm.checkpoints import (
    merged,
    reference_logits,
    write_checkpoint,
    write_peft,
    write_safetensors,
)

PROMPT = [5, 17, 42, 3, 99, 7, 250, 12, 64]


def _unpack(package: Path, dest: Path) -> Path:
    keys = generate_keypair()
    signed = package.with_name(package.name + ".signed")
    sign_package(package, signed, keys.private_key)
    verify_and_unpack(signed, dest, keys.public_key)
    return dest


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("lora")
    config, tensors = write_checkpoint(root / "ckpt", "llama")
    packages = {}
    for weights in ("fp32", "int8", "int4"):
        convert_llm(root / "ckpt", root / f"base-{weights}.ferry", weights=weights)
        packages[weights] = _unpack(root / f"base-{weights}.ferry", root / f"base-{weights}")
    return {"root": root, "config": config, "tensors": tensors, "packages": packages}


def test_an_adapter_applied_at_run_time_gives_the_merged_weights_logits(base: dict, tmp_path: Path) -> None:
    config, tensors = base["config"], base["tensors"]
    pairs = write_peft(tmp_path / "peft", config, use_rslora=True)
    scaling = 8.0 / np.sqrt(4)  # rsLoRA: alpha / sqrt(r)
    report = convert_lora(tmp_path / "peft", base["root"] / "base-fp32.ferry", tmp_path / "a.ferry")
    assert report.rank == 4 and report.scaling == pytest.approx(scaling)
    assert report.targets == sorted(TARGETS)
    assert report.package_size < (base["root"] / "base-fp32.ferry").stat().st_size / 2
    unpacked = _unpack(tmp_path / "a.ferry", tmp_path / "a")
    manifest = json.loads((unpacked / "manifest.json").read_text())
    assert manifest["metadata"]["kind"] == "llm-adapter"
    model = load_model(base["packages"]["fp32"])
    digest = base_digest(json.loads((base["packages"]["fp32"] / "manifest.json").read_text()))
    assert manifest["metadata"]["adapter"]["base_digest"] == digest  # signing did not change it
    adapter = load_adapter(unpacked, model.config, expected_base=digest)

    expected_tensors = merged(tensors, pairs, scaling)
    cache = model.new_cache()
    np.testing.assert_allclose(
        model.forward(PROMPT, cache, all_logits=True, adapter=adapter),
        reference_logits(config, expected_tensors, PROMPT),
        atol=1e-4,
        rtol=0,
    )
    tokens = list(PROMPT)
    for token in (7, 19, 200):  # cached decode steps with the adapter
        tokens.append(token)
        step = model.forward([token], cache, adapter=adapter)
        np.testing.assert_allclose(step, reference_logits(config, expected_tensors, tokens)[-1], atol=1e-4)
    # the base is untouched: without the adapter the same model gives the base's logits
    plain = model.forward(PROMPT, model.new_cache(), all_logits=True)
    np.testing.assert_allclose(plain, reference_logits(config, tensors, PROMPT), atol=1e-4)


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_an_adapter_on_a_quantized_base_moves_it_towards_the_merged_model(
    base: dict, tmp_path: Path, weights: str
) -> None:
    """int4, and int8 in the dot layout (x rounded per block of 32): the adapter's low-rank add
    rides on the base's own GEMV and GEMM."""
    config, tensors = base["config"], base["tensors"]
    pairs = write_peft(tmp_path / "peft", config)
    convert_lora(tmp_path / "peft", base["root"] / f"base-{weights}.ferry", tmp_path / "a.ferry")
    model = load_model(base["packages"][weights])
    assert model.weights.layers[0].down.group == 16 and model.weights.layers[0].down.activations == "int8"
    adapter = load_adapter(_unpack(tmp_path / "a.ferry", tmp_path / "a"), model.config)
    target = log_softmax(reference_logits(config, merged(tensors, pairs, 2.0), PROMPT))

    def kl(logits: np.ndarray) -> float:
        q = log_softmax(logits)
        return float(np.mean(np.sum(np.exp(target) * (target - q), axis=1)))

    with_adapter = kl(model.forward(PROMPT, model.new_cache(), True, adapter=adapter))
    without = kl(model.forward(PROMPT, model.new_cache(), True))
    assert with_adapter < without / 5


def test_an_adapter_for_another_base_is_refused_at_load(base: dict, tmp_path: Path) -> None:
    write_peft(tmp_path / "peft", base["config"])
    convert_lora(tmp_path / "peft", base["root"] / "base-fp32.ferry", tmp_path / "a.ferry")
    other = base_digest(json.loads((base["packages"]["int4"] / "manifest.json").read_text()))
    model = load_model(base["packages"]["int4"])
    with pytest.raises(AdapterError, match="adapter made for base .* convert it against this base"):
        load_adapter(_unpack(tmp_path / "a.ferry", tmp_path / "a"), model.config, expected_base=other)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"modules_to_save": ["lm_head"]}, "modules_to_save .* changes base weights"),
        ({"use_dora": True}, "use_dora=True is not supported"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not LORA"),
    ],
)
def test_peft_configs_the_runtime_cannot_apply_are_refused(
    base: dict, tmp_path: Path, change: dict, message: str
) -> None:
    write_peft(tmp_path / "peft", base["config"], **change)
    with pytest.raises(InvalidModelError, match=message):
        convert_lora(tmp_path / "peft", base["root"] / "base-fp32.ferry", tmp_path / "a.ferry")
    assert not (tmp_path / "a.ferry").exists()


def test_a_pair_of_the_wrong_shape_or_an_embedding_adapter_is_refused_naming_the_tensor(
    base: dict, tmp_path: Path
) -> None:
    write_peft(tmp_path / "peft", base["config"])
    wrong = {"base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight": np.zeros((4, 10), np.float32)}
    wrong["base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"] = np.zeros((64, 4), np.float32)
    write_safetensors(tmp_path / "peft" / "adapter_model.safetensors", wrong)
    with pytest.raises(InvalidModelError, match=r"model.layers.1.o_proj has lora_A \[4, 10\]"):
        convert_lora(tmp_path / "peft", base["root"] / "base-fp32.ferry", tmp_path / "a.ferry")
    embed = {"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((4, 10), np.float32)}
    write_safetensors(tmp_path / "peft" / "adapter_model.safetensors", embed)
    with pytest.raises(
        InvalidModelError, match="embed_tokens.* embedding/LM-head adapters are not supported"
    ):
        convert_lora(tmp_path / "peft", base["root"] / "base-fp32.ferry", tmp_path / "a.ferry")
    assert not (tmp_path / "a.ferry").exists()


def test_the_cli_converts_and_reports(base: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_peft(tmp_path / "peft", base["config"])
    out = tmp_path / "a.ferry"
    assert (
        main(
            [
                "convert-lora",
                str(tmp_path / "peft"),
                "--base",
                str(base["packages"]["fp32"]),
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["rank"] == 4 and out.is_file()
    assert main(["convert-lora", str(tmp_path / "peft"), "--base", str(tmp_path / "nothing")]) == 1
    assert "not a readable Ferry LLM package" in capsys.readouterr().err
