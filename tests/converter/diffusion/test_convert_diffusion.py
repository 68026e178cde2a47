"""convert_diffusion on the tiny layout: the errors a broken layout gets (everything missing
named at once, graphs that disagree), the int8 package's report (per graph and the image's
PSNR/SSIM against fp32), and the signature: the package verifies with the release key and a
tampered one is refused."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from converter.diffusion import DiffusionLayoutError, convert_diffusion, read_layout
from converter.diffusion.convert import DiffusionOptions
from converter.errors import ConversionError
from deploy.errors import PackageRejected
from deploy.package import generate_keypair, verify_and_unpack
from engine.diffusion.package import KIND, read_spec
from tests.engine.diffusion import packages, tiny


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.write_layout(tmp_path_factory.mktemp("layout") / "tiny")


@pytest.fixture(scope="module")
def int8(tmp_path_factory: pytest.TempPathFactory, layout: Path) -> packages.TinyPackage:
    return packages.build(tmp_path_factory.mktemp("int8"), "int8", layout)


def copy(layout: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(layout, tmp_path / "copy"))


def test_everything_missing_is_named_at_once(layout: Path, tmp_path: Path) -> None:
    broken = copy(layout, tmp_path)
    (broken / "unet" / "model.onnx").unlink()
    (broken / "tokenizer" / "merges.txt").unlink()
    (broken / "scheduler" / "scheduler_config.json").unlink()
    with pytest.raises(DiffusionLayoutError) as caught:
        read_layout(broken)
    message = str(caught.value)
    for part in ("unet/model.onnx", "tokenizer/", "scheduler/scheduler_config.json"):
        assert part in message
    assert "text_encoder/model.onnx" not in message


def test_cross_attention_width_must_match_the_text_encoder(layout: Path, tmp_path: Path) -> None:
    broken = copy(layout, tmp_path)
    model = onnx.load(str(broken / "unet" / "model.onnx"))
    context = next(v for v in model.graph.input if v.name == "encoder_hidden_states")
    context.type.tensor_type.shape.dim[2].dim_value = 48
    onnx.save(model, broken / "unet" / "model.onnx")
    expected = "encoder_hidden_states width is 48 but the text encoder's output is 32"
    with pytest.raises(DiffusionLayoutError, match=expected):
        read_layout(broken)


def test_unsupplied_conditioning_and_foreign_tokenizers_are_refused(layout: Path, tmp_path: Path) -> None:
    broken = copy(layout, tmp_path)
    model = onnx.load(str(broken / "unet" / "model.onnx"))
    model.graph.input.append(onnx.helper.make_tensor_value_info("time_ids", onnx.TensorProto.FLOAT, [2, 6]))
    onnx.save(model, broken / "unet" / "model.onnx")
    vocab = json.loads((broken / "tokenizer" / "vocab.json").read_text())
    vocab["<|endoftext|>"] = 5000
    (broken / "tokenizer" / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(DiffusionLayoutError) as caught:
        read_layout(broken)
    message = str(caught.value)
    assert "time_ids" in message and "past the text encoder's 530 embedding rows" in message


def test_bad_scheduler_and_options_are_refused(layout: Path, tmp_path: Path) -> None:
    broken = copy(layout, tmp_path)
    (broken / "scheduler" / "scheduler_config.json").write_text(json.dumps({"prediction_type": "sample"}))
    with pytest.raises(DiffusionLayoutError, match="prediction_type"):
        read_layout(broken)
    with pytest.raises(ConversionError, match="weights 'int2'"):
        convert_diffusion(layout, tmp_path / "x.ferry", options=DiffusionOptions(weights="int2"))
    with pytest.raises(ConversionError, match="multiple"):
        convert_diffusion(layout, tmp_path / "x.ferry", options=DiffusionOptions(size=60, size_multiple=16))
    assert not (tmp_path / "x.ferry").exists()


def test_int8_report_per_graph_and_for_the_image(int8: packages.TinyPackage) -> None:
    report = int8.report
    assert report.precision == "int8" and report.signed
    for name in ("text_encoder", "unet", "vae_decoder"):
        graph = report.graphs[name]
        assert graph["size"] < graph["fp32_size"]
        (output,) = [o for o in graph["accuracy"]["outputs"].values()][:1]
        assert output["cosine_similarity"] > 0.999
    assert report.converted_size < 0.6 * report.fp32_size  # tiny graphs: headers weigh a lot
    assert report.pipeline["psnr_db"] > 30 and 0.95 < report.pipeline["ssim"] <= 1
    assert report.pipeline["steps"] == 4 and report.pipeline["size"] == 64


def test_package_is_signed_and_self_describing(int8: packages.TinyPackage, tmp_path: Path) -> None:
    manifest = json.loads((int8.directory / "manifest.json").read_text())
    assert manifest["metadata"]["kind"] == KIND and manifest["graph"] == "diffusion.json"
    spec = read_spec(int8.directory)
    assert (spec.min_size, spec.default_size, spec.max_size, spec.size_multiple) == (32, 64, 96, 16)
    assert spec.text_width == tiny.TEXT_WIDTH and spec.max_length == tiny.MAX_LENGTH
    image = np.load(int8.directory / "selftest.npy", allow_pickle=False)
    assert image.shape == (spec.selftest.size, spec.selftest.size, 3) and image.dtype == np.uint8
    with pytest.raises(PackageRejected):
        verify_and_unpack(int8.archive, tmp_path / "other-key", generate_keypair().public_key)


def test_tampered_graph_is_refused(int8: packages.TinyPackage, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered.ferry"
    with (
        tarfile.open(int8.archive) as source,
        tarfile.open(tampered, "w", format=tarfile.USTAR_FORMAT) as out,
    ):
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name == "unet.ferry":
                data = data[:-100] + bytes(100 - 1) + b"\x01"
            out.addfile(member, io.BytesIO(data))
    with pytest.raises(PackageRejected, match="unet.ferry"):
        verify_and_unpack(tampered, tmp_path / "unpacked", int8.public_key)
    assert not (tmp_path / "unpacked" / "unet.ferry").exists()


def test_same_layout_gives_the_same_package(layout: Path, tmp_path: Path) -> None:
    options = DiffusionOptions(weights="fp32", **packages.OPTIONS)
    convert_diffusion(layout, tmp_path / "a.ferry", options=options)
    convert_diffusion(layout, tmp_path / "b.ferry", options=options)
    assert (tmp_path / "a.ferry").read_bytes() == (tmp_path / "b.ferry").read_bytes()
