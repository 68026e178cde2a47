"""The large-model route (weights past protobuf's 2 GB, e.g. SD-1.5's UNet): weights left in their
external files and memory-mapped, the checker run on the file's path, the package streamed.
A real >2 GB model is too big for CI, so these lower ``Limits.large_model_bytes`` (the size
where the route starts) to run the very same code on small models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from converter import InvalidModelError, convert
from converter.diffusion.convert import MAX_MODEL_BYTES, diffusion_limits
from converter.limits import GIB, Limits
from converter.load import load_model
from converter.samples import build_image_classifier
from converter.translate import translate
from deploy.package import write_package
from engine import Session
from engine.format import model_files, write_model_files
from tests.converter import models

LARGE = Limits(large_model_bytes=1)  # every model with external data takes the large route


@pytest.fixture
def dst(tmp_path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out / "model.ferry"


def saved_external(model: onnx.ModelProto, directory: Path) -> Path:
    """``model`` saved as ``directory/model.onnx`` with every initializer in ``weights.pb``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.pb", size_threshold=0)
    return path


def ort_run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_large_route_leaves_weights_on_disk_and_maps_them(tmp_path):
    src = saved_external(build_image_classifier(), tmp_path / "m")
    loaded = load_model(src, LARGE)
    assert loaded.path == src
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.model.graph.initializer)
    assert not any(t.raw_data for t in loaded.model.graph.initializer)
    graph = translate(loaded.model, 17, loaded.external_dir)
    mapped = [a for a in graph.tensors.values() if isinstance(a, np.memmap)]
    assert len(mapped) == len(loaded.model.graph.initializer)
    small = load_model(src, Limits())  # under the threshold: the weights are loaded as before
    assert small.path is None
    for tensor in small.model.graph.initializer:
        np.testing.assert_array_equal(graph.tensors[tensor.name], onnx.numpy_helper.to_array(tensor))


def test_large_route_gives_the_same_package_as_the_in_memory_one(tmp_path):
    src = saved_external(build_image_classifier(), tmp_path / "m")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    convert(src, tmp_path / "a" / "m.ferry", limits=Limits())
    convert(src, tmp_path / "b" / "m.ferry", limits=LARGE)
    assert (tmp_path / "a" / "m.ferry").read_bytes() == (tmp_path / "b" / "m.ferry").read_bytes()
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = Session(tmp_path / "b" / "m.ferry").run({"image": x})
    np.testing.assert_allclose(next(iter(got.values())), ort_run(src, {"image": x}), rtol=1e-4, atol=1e-5)


def test_large_route_upgrades_an_old_opset(tmp_path, dst):
    src = saved_external(models.opset9_cnn(), tmp_path / "m")
    report = convert(src, dst, limits=LARGE, quantize="int8")
    assert (report.source_opset, report.opset) == (9, 11)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(Session(dst).run({"x": x})["y"], ort_run(src, {"x": x}), atol=2e-2)


def test_large_route_runs_the_onnx_checker_on_the_path(tmp_path, dst):
    broken = models.type_mismatch()
    broken.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(4, np.float32), "unused"))
    src = saved_external(broken, tmp_path / "m")
    with pytest.raises(InvalidModelError, match="fails the ONNX checker"):
        convert(src, dst, limits=LARGE)


def test_large_route_refuses_external_data_past_the_end_of_its_file(tmp_path, dst):
    src = saved_external(models.opset9_cnn(), tmp_path / "m")
    weights = src.parent / "weights.pb"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(InvalidModelError, match="past the end of its"):
        convert(src, dst, limits=LARGE)
    assert not dst.exists()


def test_in_memory_model_past_the_threshold_asks_for_a_path(dst):
    with pytest.raises(InvalidModelError, match="pass the .onnx path"):
        convert(models.opset9_cnn(), dst, limits=Limits(large_model_bytes=100))


def test_diffusion_limit_fits_sd15_unet_and_the_environment_still_sets_it(monkeypatch):
    assert diffusion_limits().max_model_bytes == MAX_MODEL_BYTES > 3_438_000_000  # SD-1.5 UNet, fp32
    assert Limits.from_env().max_model_bytes == 2 * GIB
    monkeypatch.setenv("FERRY_CONVERTER_MAX_MODEL_BYTES", "1000")
    monkeypatch.setenv("FERRY_CONVERTER_LARGE_MODEL_BYTES", "10")
    assert (diffusion_limits().max_model_bytes, diffusion_limits().large_model_bytes) == (1000, 10)


def test_streamed_model_files_match_the_in_memory_ones(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": np.arange(7, dtype=">i4"),  # big-endian: stored little-endian
        "c": np.float16(2.5) * np.ones((), np.float16),  # 0-d stays 0-d
        "d": rng.standard_normal((4, 6)).T,  # not contiguous
        "e": np.zeros((0, 3), np.float32),
    }
    graph = {"nodes": [], "inputs": [], "outputs": []}
    in_memory = model_files(graph=graph, tensors=tensors)
    on_disk = write_model_files(tmp_path, graph=graph, tensors=tensors)
    assert [(n, p.read_bytes()) for n, p in on_disk] == in_memory
    write_package(tmp_path / "bytes.ferry", files=in_memory, inputs=[], outputs=[])
    write_package(tmp_path / "files.ferry", files=on_disk, inputs=[], outputs=[])
    assert (tmp_path / "bytes.ferry").read_bytes() == (tmp_path / "files.ferry").read_bytes()
