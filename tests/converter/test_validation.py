"""convert() refuses bad sources with specific, readable errors and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int4", "block_size": 16}, "block_size must be one of"),
        ({"quantize": "fp16", "keep_float": "first_last"}, "apply only to quantize='int8' or 'int4'"),
        ({"quantize": "int8", "keep_float": "firsts"}, "keep_float must be 'first_last'"),
        ({"quantize": "int8", "accuracy_budget": 1.5}, "minimum cosine similarity"),
        ({"quantize": "int8", "keep_float": ["no_such_node"]}, "does not have: \\['no_such_node'\\]"),
        ({"quantize": "int8", "calibration": {"wrong": np.zeros(3)}}, "inputs \\['image'\\] missing"),
    ],
    ids=["int4-block", "keep-fp16", "keep-word", "budget", "keep-unknown", "calibration-names"],
)
def test_bad_quantization_options(dst, options, message):
    with pytest.raises(ConversionError, match=message):
        convert(build_image_classifier(), dst, **options)
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


def relu_chain(order: list[int]) -> onnx.ModelProto:
    nodes = [
        onnx.helper.make_node("Relu", ["x"], ["a"], name="first"),
        onnx.helper.make_node("Relu", ["a"], ["y"], name="second"),
    ]
    return models.model([nodes[i] for i in order], [models.fvalue("x", [2])], [models.fvalue("y", [2])])


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            relu_chain([1, 0]),
            "not topologically sorted: node 'second' reads 'a', which the later node 'first'",
        ),
        (
            models.model(
                [onnx.helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
                [models.fvalue("x", [2])],
                [models.fvalue("y", [2])],
            ),
            "node 'add' \\(Add\\) reads 'ghost', which no graph input, initializer or node produces",
        ),
        (
            models.model(
                [
                    onnx.helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                    onnx.helper.make_node("Relu", ["a"], ["b"], name="n2"),
                    onnx.helper.make_node("Relu", ["b"], ["y"], name="n3"),
                ],
                [models.fvalue("x", [2])],
                [models.fvalue("y", [2])],
            ),
            "the graph has a cycle: 'n1' -> 'n2' -> 'n1'",
        ),
    ],
    ids=["unsorted", "dangling", "cycle"],
)
def test_graph_structure_errors_name_the_node(dst, source, message):
    with pytest.raises(InvalidModelError, match=message):
        convert(source, dst)
    assert_nothing_written(dst)


def test_initializer_with_the_wrong_byte_size(dst):
    weight = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    weight.raw_data = weight.raw_data[:20]
    m = models.model(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])],
        [models.fvalue("x", [4, 4])],
        [models.fvalue("y", [4, 4])],
        initializers=[weight],
    )
    with pytest.raises(
        InvalidModelError, match="initializer 'w' holds 5 value\\(s\\) but its shape \\[4, 4\\] needs 16"
    ):
        convert(m, dst)
    assert_nothing_written(dst)


def test_tensor_and_model_size_limits(dst, tmp_path):
    from converter.limits import Limits

    huge = models.model(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        [models.fvalue("x", ["n", 100_000, 100_000])],
        [models.fvalue("y", ["n", 100_000, 100_000])],
    )
    with pytest.raises(InvalidModelError, match="tensor 'x' .* over the 1,000,000-byte tensor limit"):
        convert(huge, dst, limits=Limits(max_tensor_bytes=1_000_000))
    src = tmp_path / "m.onnx"
    onnx.save(build_image_classifier(), src)
    with pytest.raises(InvalidModelError, match="over the 1,000-byte limit"):
        convert(src, dst, limits=Limits(max_model_bytes=1_000))
    assert_nothing_written(dst)


def test_opset_newer_than_onnx_knows(dst):
    m = models.model(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], [models.fvalue("x", [2])], [models.fvalue("y", [2])]
    )
    m.opset_import[0].version = 99
    with pytest.raises(InvalidModelError, match="opset 99 is newer than"):
        convert(m, dst)


def external_model(tmp_path: Path, location: str) -> Path:
    """A model whose weight 'w' is external data at ``location`` (relative to the model)."""
    m = models.model(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])],
        [models.fvalue("x", [4])],
        [models.fvalue("y", [4])],
        initializers=[onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")],
    )
    tensor = m.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    models_dir = tmp_path / "models"
    models_dir.mkdir(exist_ok=True)
    onnx.save(m, models_dir / "model.onnx")
    return models_dir / "model.onnx"


def test_external_data_next_to_the_model_is_loaded(tmp_path, dst):
    src = external_model(tmp_path, "weights.bin")
    (src.parent / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    convert(src, dst)
    np.testing.assert_array_equal(Session(dst).run({"x": np.zeros(4, np.float32)})["y"], np.arange(4))


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("/etc/passwd", "an absolute path"),
        ("C:\\weights.bin", "an absolute path"),
        ("../secret.bin", "leaves the model's directory"),
        ("link.bin", "'link.bin' is a symbolic link"),
    ],
    ids=["absolute", "drive", "dotdot", "symlink"],
)
def test_external_data_must_stay_in_the_model_directory(tmp_path, dst, location, message):
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    src = external_model(tmp_path, location)
    (src.parent / "link.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(InvalidModelError, match=f"tensor 'w' has external data at .*{message}"):
        convert(src, dst)
    assert_nothing_written(dst)


def test_dynamic_inputs_are_recorded(dst):
    from engine.format import read_package

    report = convert(build_image_classifier(), dst)
    assert report.dynamic_inputs == ["image"]
    assert read_package(dst).manifest["metadata"]["dynamic_inputs"] == ["image"]
    assert read_package(dst).manifest["inputs"][0]["shape"] == ["N", 3, 32, 32]


def test_limits_from_the_environment(dst, monkeypatch):
    monkeypatch.setenv("FERRY_CONVERTER_MAX_MODEL_BYTES", "100")
    with pytest.raises(InvalidModelError, match="over the 100-byte limit"):
        convert(build_image_classifier(), dst)
    monkeypatch.setenv("FERRY_CONVERTER_MAX_MODEL_BYTES", "lots")
    with pytest.raises(
        ConversionError, match="FERRY_CONVERTER_MAX_MODEL_BYTES must be a whole number of bytes"
    ):
        convert(build_image_classifier(), dst)
    assert_nothing_written(dst)


SMALL_MODEL = models.opset9_cnn().SerializeToString()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_models_fail_cleanly(tmp_path_factory, data):
    """Flipped, dropped or inserted bytes: either a package or a ConversionError, never a crash."""
    raw = bytearray(SMALL_MODEL)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        kind = data.draw(st.sampled_from(["flip", "drop", "insert"]), label="kind")
        if kind == "flip":
            raw[at] ^= data.draw(st.integers(1, 255), label="mask")
        elif kind == "drop":
            del raw[at]
        else:
            raw.insert(at, data.draw(st.integers(0, 255), label="byte"))
    folder = tmp_path_factory.mktemp("fuzz")
    src, dst = folder / "m.onnx", folder / "m.ferry"
    src.write_bytes(bytes(raw))
    try:
        convert(src, dst)
    except ConversionError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        assert_nothing_written(dst)
    else:
        assert Session(dst).self_test().passed
