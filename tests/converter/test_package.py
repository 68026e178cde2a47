"""What convert() writes: deterministic bytes, metadata, self-test vectors, fp16 weights, clean graphs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from converter import __version__, convert
from converter.samples import build_image_classifier
from engine import Session
from engine.format import read_package
from engine.ops.fastmath import forced_forms
from tests.converter import models
from tests.converter.test_optimize import transformer_block


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "classifier.onnx"
    onnx.save(build_image_classifier(seed=1), path)
    return path


@pytest.mark.parametrize("quantize", [None, "fp16"])
def test_same_model_gives_identical_bytes(onnx_file, tmp_path, quantize):
    first, second = tmp_path / "a.ferry", tmp_path / "b.ferry"
    convert(onnx_file, first, quantize=quantize)
    convert(onnx_file, second, quantize=quantize)
    assert first.read_bytes() == second.read_bytes()


def test_bytes_do_not_depend_on_the_math_forms_this_process_measured(tmp_path):
    """The self-test outputs in a package come from the engine's fixed forms, whichever GELU and
    exponential this process measured fastest (engine.ops.fastmath): a re-run elsewhere must
    give the same bytes, as the registry stores packages by digest."""
    block = transformer_block()  # its GELU is fused into a MatMul
    packages = []
    for natural_exp, table_gelu in ((False, False), (True, True)):
        with forced_forms(natural_exp, table_gelu):
            packages.append(tmp_path / f"block-{natural_exp}.ferry")
            convert(block, packages[-1])
    assert packages[0].read_bytes() == packages[1].read_bytes()
    # ...while the two forms really do differ in the last bits on this input
    package = read_package(packages[0])
    feeds = {"x": np.asarray(package.tensors["selftest/input/x"])}
    with forced_forms(False, False):
        polynomial = Session(packages[0]).run(feeds)["y"]
    with forced_forms(True, True):
        table = Session(packages[0]).run(feeds)["y"]
    assert not np.array_equal(polynomial, table)
    np.testing.assert_allclose(polynomial, table, rtol=1e-5, atol=1e-6)


def test_metadata_and_report(onnx_file, tmp_path):
    dst = tmp_path / "m.ferry"
    report = convert(onnx_file, dst)
    meta = read_package(dst).manifest["metadata"]
    assert meta["source_sha256"] == hashlib.sha256(onnx_file.read_bytes()).hexdigest() == report.source_sha256
    assert (meta["source_opset"], meta["producer"]) == (17, "ferry.samples 1")
    assert (meta["converter_version"], meta["quantize"]) == (__version__, None)
    assert meta["report"] == {
        k: v for k, v in report.to_dict().items() if k not in ("source", "package_size")
    }
    assert report.source == str(onnx_file)
    assert report.source_size == onnx_file.stat().st_size
    assert report.package_size == dst.stat().st_size
    assert (report.nodes_before, report.nodes_after) == (9, 7)  # Conv+Relu fused twice
    assert report.inputs == [{"name": "image", "dtype": "float32", "shape": ["N", 3, 32, 32]}]
    assert report.outputs == [{"name": "probabilities", "dtype": "float32", "shape": ["N", 10]}]
    json.dumps(report.to_dict())  # the control plane stores it as JSON


def test_self_test_vectors_are_stored_and_reproducible(onnx_file, tmp_path):
    dst = tmp_path / "m.ferry"
    convert(onnx_file, dst)
    package = read_package(dst)
    spec = package.manifest["metadata"]["selftest"]
    assert spec["inputs"] == {"image": "selftest/input/image"}
    assert spec["outputs"] == {"probabilities": "selftest/output/probabilities"}
    assert (spec["atol"], spec["rtol"]) == (1e-4, 1e-3)
    x = package.tensors["selftest/input/image"]
    assert x.shape == (1, 3, 32, 32)  # the symbolic batch set to 1
    want = ReferenceEvaluator(build_image_classifier(seed=1)).run(None, {"image": np.array(x)})[0]
    np.testing.assert_allclose(package.tensors["selftest/output/probabilities"], want, rtol=1e-4, atol=1e-5)
    assert Session(dst).self_test().passed


def test_fp16_halves_the_weights_and_reports_the_cost(onnx_file, tmp_path):
    full, half = tmp_path / "full.ferry", tmp_path / "half.ferry"
    baseline = convert(onnx_file, full)
    report = convert(onnx_file, half, quantize="fp16")
    assert report.weights_bytes * 2 == baseline.weights_bytes
    package = read_package(half)
    assert package.tensors["conv1.weight"].dtype == np.float16
    assert package.graph["load_casts"]["conv1.weight"] == "float32"
    assert report.quantize == "fp16" and report.kept_fp32 == []
    assert 0 < report.fp16_max_abs_error < 1e-2
    assert report.fp16_cosine_similarity > 0.9999
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got, want = Session(half).run({"image": x}), Session(full).run({"image": x})
    assert got["probabilities"].dtype == np.float32
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-2)
    assert Session(half).self_test().passed


def test_fp16_keeps_tensors_beyond_its_range_in_fp32(tmp_path):
    big = onnx.numpy_helper.from_array(np.array([1e6, 1.0], np.float32), "big")
    m = models.model(
        [onnx.helper.make_node("Mul", ["x", "big"], ["y"])],
        [models.fvalue("x", [2])],
        [models.fvalue("y", [2])],
        initializers=[big],
    )
    report = convert(m, tmp_path / "m.ferry", quantize="fp16")
    assert report.kept_fp32 == ["big"]
    assert read_package(tmp_path / "m.ferry").tensors["big"].dtype == np.float32


def test_constants_identities_and_dead_nodes_are_gone(tmp_path):
    dst = tmp_path / "m.ferry"
    report = convert(models.constants_identity_and_dead_branch(), dst)
    assert (report.nodes_before, report.nodes_after) == (4, 1)
    package = read_package(dst)
    assert package.graph["nodes"] == [
        {"name": "Add_3", "op": "Add", "inputs": ["x", "k"], "outputs": ["y"], "attrs": {}}
    ]
    assert set(package.graph["tensors"]) == {"k", "selftest/input/x", "selftest/output/y"}
    assert report.inputs == [{"name": "x", "dtype": "float32", "shape": ["batch", 2]}]
    x = np.array([[1, 2], [3, 4]], np.float32)
    np.testing.assert_array_equal(Session(dst).run({"x": x})["y"], x + np.array([1.5, -2], np.float32))


def test_tensor_attributes_survive_json_including_infinity(tmp_path):
    dst = tmp_path / "m.ferry"
    convert(models.masked_fill(), dst)
    fill = next(n for n in read_package(dst).graph["nodes"] if n["op"] == "ConstantOfShape")
    assert fill["attrs"]["value"] == {"dtype": "float32", "shape": [1], "data": ["-inf"]}
    x = np.array([[-1e30, 0, 1], [2, -3, 4]], np.float32)
    np.testing.assert_array_equal(Session(dst).run({"x": x})["y"], x)


def test_unnamed_dynamic_dims_get_unique_names(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 2])
    m = models.model([onnx.helper.make_node("Relu", ["x"], ["y"])], [x], [models.fvalue("y", [None, 2])])
    report = convert(m, tmp_path / "m.ferry")
    assert report.inputs[0]["shape"] == ["x:0", 2]


def test_progress_reports_each_step_in_order(tmp_path):
    seen = []
    convert(build_image_classifier(), tmp_path / "m.ferry", progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    messages = [m for _, m in seen]
    for step in (
        "validating",
        "optimizing",
        "writing draft package",
        "self-testing",
        "writing package",
        "done",
    ):
        assert step in messages
