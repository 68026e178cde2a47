"""convert() refuses bad sources with specific, readable errors and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from converter import (
    ConversionError,
    InvalidModelError,
    SelfTestError,
    UnsupportedOperatorsError,
    convert,
)
from converter.samples import build_image_classifier
from engine import Session
from tests.converter import models


def assert_nothing_written(dst: Path) -> None:
    assert not [p.name for p in dst.parent.iterdir() if p.name.startswith(dst.name)]  # no package, no .tmp


@pytest.fixture
def dst(tmp_path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out / "model.ferry"


def write(tmp_path: Path, data: bytes, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the file is empty, not an ONNX model"),
        (np.random.default_rng(0).bytes(4096), "not an ONNX model"),
        (b"hello, I am a text file\n", "not an ONNX model"),
    ],
    ids=["empty", "random-bytes", "text"],
)
def test_malformed_files(tmp_path, dst, data, message):
    src = write(tmp_path, data)
    with pytest.raises(InvalidModelError, match=message) as info:
        convert(src, dst)
    assert str(src) in str(info.value)
    assert "\n" not in str(info.value)
    assert_nothing_written(dst)


def test_missing_file(tmp_path, dst):
    with pytest.raises(InvalidModelError, match=r"nope\.onnx: no such file"):
        convert(tmp_path / "nope.onnx", dst)
    assert_nothing_written(dst)


def test_directory_is_not_a_model(tmp_path, dst):
    with pytest.raises(InvalidModelError, match="not a file"):
        convert(tmp_path, dst)


def test_model_failing_the_checker(dst):
    with pytest.raises(InvalidModelError, match="fails the ONNX checker") as info:
        convert(models.type_mismatch(), dst)
    assert "\n" not in str(info.value)
    assert_nothing_written(dst)


def test_unsupported_operators_are_all_named_at_once(dst):
    with pytest.raises(UnsupportedOperatorsError) as info:
        convert(models.two_unsupported_ops(), dst)
    assert info.value.operators == {"Hardmax": ["hard", "Hardmax_3"], "ReduceLogSumExp": ["lse"]}
    message = str(info.value)
    assert message.startswith("2 unsupported operator(s): ")
    assert "Hardmax (nodes: hard, Hardmax_3)" in message and "ReduceLogSumExp (nodes: lse)" in message
    assert_nothing_written(dst)


def test_custom_domain_is_rejected_with_the_other_unsupported_ops(dst):
    with pytest.raises(UnsupportedOperatorsError) as info:
        convert(models.custom_domain_op(), dst)
    assert info.value.operators == {
        "com.acme::FusedThing (custom domain)": ["fused"],
        "Hardmax": ["hard"],
    }
    assert_nothing_written(dst)


def test_unsupported_attribute_values_are_caught_at_conversion(dst):
    m = models.model(
        [
            onnx.helper.make_node("Cast", ["x"], ["y"], name="to_bf16", to=onnx.TensorProto.BFLOAT16),
            onnx.helper.make_node("Cast", ["y"], ["z"], to=onnx.TensorProto.FLOAT),
        ],
        [models.fvalue("x", [2])],
        [models.fvalue("z", [2])],
    )
    with pytest.raises(UnsupportedOperatorsError) as info:
        convert(m, dst)
    assert info.value.operators == {"Cast to ONNX data type 16 is not implemented": ["to_bf16"]}
    assert_nothing_written(dst)


def test_unsupported_operators_is_a_conversion_error():
    assert issubclass(UnsupportedOperatorsError, ConversionError)
    assert issubclass(InvalidModelError, ConversionError)


def test_opset_9_model_is_upgraded_and_still_computes_the_same(tmp_path, dst):
    source = models.opset9_cnn()
    report = convert(source, dst)
    assert (report.source_opset, report.opset) == (9, 11)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(Session(dst).run({"x": x})["y"], want[0], rtol=1e-4, atol=1e-5)


def test_input_without_shape_is_rejected(dst):
    m = models.model(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
        [models.fvalue("y", [2])],
    )
    with pytest.raises(InvalidModelError, match="shape"):  # the checker already insists on one
        convert(m, dst)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_integer_quantization_is_refused_honestly(dst, mode):
    with pytest.raises(ConversionError, match=f"quantize='{mode}' is not supported yet"):
        convert(build_image_classifier(), dst, quantize=mode)
    assert_nothing_written(dst)


@pytest.mark.parametrize(
    ("options", "message"), [({"quantize": "bf16"}, "not a known mode"), ({"block_size": 0}, "block_size")]
)
def test_bad_options(dst, options, message):
    with pytest.raises(ConversionError, match=message):
        convert(build_image_classifier(), dst, **options)


def test_destination_directory_must_exist(tmp_path):
    with pytest.raises(ConversionError, match="no such directory"):
        convert(build_image_classifier(), tmp_path / "missing" / "m.ferry")


def test_self_test_failure_writes_nothing(dst):
    with pytest.raises(SelfTestError, match="node 'lookup' \\(Gather\\) failed"):
        convert(models.gather_out_of_range_on_selftest(), dst)
    assert_nothing_written(dst)


def test_failed_conversion_keeps_an_existing_package(dst):
    convert(build_image_classifier(), dst)
    before = dst.read_bytes()
    with pytest.raises(UnsupportedOperatorsError):
        convert(models.two_unsupported_ops(), dst)
    assert dst.read_bytes() == before
