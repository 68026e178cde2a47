"""int8 / int4 weight quantization: the arithmetic against onnxruntime's DequantizeLinear, the
engine's fused kernels against numpy, and what convert() writes and reports."""

from __future__ import annotations

import tarfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter import ConversionError, convert
from converter import quantize as quant
from engine import Session
from engine.format import read_package
from engine.ops.quantized import dequantize, qgather, qmatmul, unpack4
from tests.converter.models import fvalue, model

RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ort_dequantize(
    x: onnx.TensorProto, scale: np.ndarray, zero: onnx.TensorProto | None, **attrs
) -> np.ndarray:
    """onnxruntime's DequantizeLinear (opset 21) on constant inputs."""
    inputs = ["x", "scale"] + (["zero"] if zero is not None else [])
    initializers = [x, numpy_helper.from_array(scale, "scale")] + ([zero] if zero is not None else [])
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", inputs, ["y"], **attrs)],
        "dq",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]


@pytest.mark.parametrize("axis", [0, 1])
def test_int8_per_channel_matches_onnxruntime(axis):
    w = rand(48, 40)
    q, scale = quant.quantize_int8(w, axis)
    assert q.dtype == np.int8 and scale.shape == (w.shape[axis],) and np.abs(q).max() == 127
    want = ort_dequantize(numpy_helper.from_array(q, "x"), scale, None, axis=axis)
    got = dequantize(q, scale, None, {"axis": axis})
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - w).max() <= scale.max() / 2 + 1e-6  # rounding error at most half a step


@pytest.mark.parametrize("block", [32, 64, 128])
def test_int4_blockwise_matches_onnxruntime(block):
    w = rand(200, 24)  # 200 rows: the last block is shorter
    q, scale, zero = quant.quantize_int4(w, block)
    assert scale.dtype == np.float16 and scale.shape == (-(-200 // block), 24)
    assert q.max() <= 15 and zero.max() <= 15
    x = helper.make_tensor("x", TensorProto.UINT4, q.shape, q.reshape(-1).tolist())
    zp = helper.make_tensor("zero", TensorProto.UINT4, zero.shape, zero.reshape(-1).tolist())
    want = ort_dequantize(x, scale.astype(np.float32), zp, axis=0, block_size=block)
    attrs = {"axis": 0, "block_size": block, "packed": "uint4", "shape": list(w.shape)}
    got = dequantize(quant.pack4(q), scale.astype(np.float32), quant.pack4(zero), attrs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    step = scale.astype(np.float32).max()
    assert np.abs(got - w).max() <= step / 2 + 1e-4


@pytest.mark.parametrize("count", [1, 2, 7, 64])
def test_pack4_round_trips(count):
    values = RNG.integers(0, 16, size=count).astype(np.uint8)
    packed = quant.pack4(values)
    assert packed.size == (count + 1) // 2
    assert packed[0] & 0x0F == values[0]  # low nibble first
    np.testing.assert_array_equal(unpack4(packed, [count], signed=False), values)
    signed = values.astype(np.int8) - 8
    np.testing.assert_array_equal(unpack4(quant.pack4(signed), [count], signed=True), signed)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("k", [300, 64])  # 300: several QMatMul row chunks and a partial block
def test_qmatmul_equals_matmul_with_the_dequantized_weight(mode, k):
    w, a, bias = rand(k, 33), rand(2, 5, k), rand(33)
    if mode == "int8":
        q, scale = quant.quantize_int8(w, 1)
        inputs, attrs = [a, q, scale, None, bias], {"axis": 1}
        full = dequantize(q, scale, None, attrs)
    else:
        q, scale, zero = quant.quantize_int4(w, 32)
        attrs = {"axis": 0, "block_size": 32, "packed": "uint4", "shape": [k, 33]}
        inputs = [a, quant.pack4(q), scale.astype(np.float32), quant.pack4(zero), bias]
        full = dequantize(inputs[1], inputs[2], inputs[3], attrs)
    (got,) = qmatmul(inputs, attrs)
    np.testing.assert_allclose(got, a @ full + bias, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_qgather_dequantizes_only_the_gathered_rows(mode):
    table, indices = rand(50, 64), np.array([[3, -1], [0, 49]], np.int64)
    if mode == "int8":
        q, scale = quant.quantize_int8(table, 0)
        inputs, attrs = [q, scale, None, indices], {"axis": 0}
        full = dequantize(q, scale, None, attrs)
    else:
        q, scale, zero = quant.quantize_int4(np.ascontiguousarray(table.T), 32)
        attrs = {"axis": 1, "block_size": 32, "packed": "uint4", "shape": [50, 64]}
        inputs = [quant.pack4(q.T.copy()), scale.T.astype(np.float32), quant.pack4(zero.T.copy()), indices]
        full = dequantize(inputs[0], inputs[1], inputs[2], attrs)
    (got,) = qgather(inputs, attrs)
    np.testing.assert_array_equal(got, full[[[3, 49], [0, 49]]])
    assert np.abs(got - table[[[3, 49], [0, 49]]]).max() < 0.5


def mlp(width: int = 512, seed: int = 0) -> onnx.ModelProto:
    """Embedding -> MatMul+Add -> Relu -> Gemm(transB) -> Softmax: every quantized form at once."""
    rng = np.random.default_rng(seed)
    weights = {
        "embed": rng.standard_normal((1000, width)) * 0.5,
        "w1": rng.standard_normal((width, width)) / np.sqrt(width),
        "b1": rng.standard_normal(width) * 0.1,
        "w2": rng.standard_normal((10, width)) / np.sqrt(width),
        "b2": rng.standard_normal(10) * 0.1,
    }
    return model(
        [
            helper.make_node("Gather", ["embed", "ids"], ["e"], name="embed"),
            helper.make_node("ReduceMean", ["e"], ["pooled"], axes=[1], keepdims=0, name="pool"),
            helper.make_node("MatMul", ["pooled", "w1"], ["h"], name="fc1"),
            helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
            helper.make_node("Relu", ["hb"], ["r"], name="relu"),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], name="fc2", transB=1),
            helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        ],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
        [fvalue("probs", ["batch", 10])],
        initializers=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )


@pytest.fixture(scope="module")
def mlp_packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlp")
    calibration = {"ids": np.random.default_rng(3).integers(0, 1000, size=(32, 8))}
    reports = {
        mode: convert(mlp(), root / f"{mode}.ferry", quantize=mode, calibration=calibration)
        for mode in (None, "int8", "int4")
    }
    return root, reports, calibration


def test_int8_and_int4_packages_are_small_and_accurate(mlp_packages):
    root, reports, calibration = mlp_packages
    fp32 = reports[None].converted_size
    assert reports["int8"].converted_size / fp32 <= 0.27
    assert reports["int4"].converted_size / fp32 <= 0.16
    assert reports["int8"].size_ratio == pytest.approx(reports["int8"].converted_size / fp32, abs=1e-4)
    want = Session(root / "None.ferry").run(calibration)["probs"]
    for mode, (cosine, top1) in {"int8": (0.9999, 0.95), "int4": (0.995, 0.8)}.items():
        got = Session(root / f"{mode}.ferry").run(calibration)["probs"]
        report = reports[mode].accuracy
        assert report["inputs"] == "calibration" and report["samples"] == 1
        figures = report["outputs"]["probs"]
        assert figures["cosine_similarity"] >= cosine and figures["top1_agreement"] >= top1
        # the report's figures are what a user measures on the same inputs
        assert figures["max_abs_error"] == pytest.approx(float(np.abs(got - want).max()), rel=1e-5)
        assert Session(root / f"{mode}.ferry").self_test().passed


def test_what_each_weight_becomes(mlp_packages):
    root, reports, _ = mlp_packages
    assert reports["int8"].quantized_weights == ["embed", "w1", "w2"]
    graph = read_package(root / "int4.ferry")
    ops = {node["name"]: node["op"] for node in graph.graph["nodes"]}
    assert ops == {
        "embed": "QGather",
        "pool": "ReduceMean",
        "fc1": "QMatMul",
        "fc2": "QMatMul",
        "softmax": "Softmax",
    }
    fc1 = next(node for node in graph.graph["nodes"] if node["name"] == "fc1")
    assert fc1["attrs"]["activation"] == "Relu" and fc1["inputs"][-1] == "b1"  # bias and Relu fused
    assert graph.tensors["w1/q"].dtype == np.uint8 and graph.tensors["w1/q"].size == 512 * 512 // 2
    assert graph.tensors["w1/scale"].dtype == np.float16  # stored half size, cast at load
    assert graph.graph["load_casts"]["w1/scale"] == "float32"
    assert read_package(root / "int8.ferry").tensors["w2/q"].dtype == np.int8


def test_int4_conversion_is_deterministic(tmp_path):
    first, second = tmp_path / "a.ferry", tmp_path / "b.ferry"
    convert(mlp(width=64), first, quantize="int4", block_size=64)
    convert(mlp(width=64), second, quantize="int4", block_size=64)
    assert first.read_bytes() == second.read_bytes()


def test_keep_first_and_last_layers_float(tmp_path):
    report = convert(mlp(width=64), tmp_path / "m.ferry", quantize="int4", keep_float="first_last")
    assert report.float_layers == ["embed", "fc2"]
    assert report.quantized_weights == ["w1"]
    assert read_package(tmp_path / "m.ferry").tensors["embed"].dtype == np.float32


def test_accuracy_budget_keeps_the_worst_layers_float(tmp_path):
    loose = convert(mlp(width=64), tmp_path / "a.ferry", quantize="int4")
    worst = loose.accuracy["outputs"]["probs"]["cosine_similarity"]
    assert worst < 0.99999
    budget = 1 - (1 - worst) / 4  # a quarter of the error int4 costs
    seen = []
    report = convert(
        mlp(width=64),
        tmp_path / "b.ferry",
        quantize="int4",
        accuracy_budget=budget,
        progress=lambda fraction, message: seen.append((fraction, message)),
    )
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)  # a progress bar never goes back
    assert any(m.startswith("accuracy budget: trying 1 layer(s) in float32") for _, m in seen)
    assert report.accuracy["outputs"]["probs"]["cosine_similarity"] >= budget
    assert report.float_layers and set(report.float_layers) <= {"embed", "fc1", "fc2"}
    assert report.converted_size > loose.converted_size


def test_calibration_from_an_npz_file(tmp_path):
    path = tmp_path / "calibration.npz"
    np.savez(path, ids=np.random.default_rng(0).integers(0, 1000, size=(4, 8)))
    report = convert(mlp(width=64), tmp_path / "m.ferry", quantize="int8", calibration=path)
    assert report.accuracy["inputs"] == "calibration"


def test_conv_weights_int8_and_int4_match_onnxruntime_closely(tmp_path):
    from converter.samples import build_image_classifier

    source = build_image_classifier(seed=3)
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"image": x}
    )[0]
    for mode, tolerance in (("int8", 0.02), ("int4", 0.1)):
        dst = tmp_path / f"{mode}.ferry"
        report = convert(source, dst, quantize=mode)
        assert report.quantized_weights == ["conv1.weight", "conv2.weight", "fc.weight"]
        got = Session(dst).run({"image": x})["probabilities"]
        assert np.abs(got - want).max() < tolerance
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.75


@pytest.mark.parametrize(("zero_dtype", "axis"), [(np.uint8, None), (np.int8, 1)])
def test_quantize_linear_matches_onnxruntime(zero_dtype, axis):
    x = rand(6, 5) * 3
    if axis is None:
        scale, zero = np.array(0.02, np.float32), np.array(128 if zero_dtype == np.uint8 else 0, zero_dtype)
    else:
        scale, zero = (np.abs(rand(5)) * 0.05 + 0.01).astype(np.float32), np.arange(5).astype(zero_dtype)
    attrs = {} if axis is None else {"axis": axis}
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["y"], **attrs)],
        "q",
        [fvalue("x", [6, 5])],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(zero_dtype)), [6, 5])],
        initializer=[numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(zero, "zero")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    from engine.ops.quantized import quantize_linear

    (got,) = quantize_linear([x, scale, zero], attrs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_static_int8_activations_from_calibration(tmp_path, method):
    calibration = {"ids": np.random.default_rng(5).integers(0, 1000, size=(16, 8))}
    dst = tmp_path / "m.ferry"
    report = convert(mlp(width=64), dst, quantize="int8", calibration=calibration, activations=method)
    assert report.activations == method
    # the activations read by the two quantized matmuls: the pooled embedding and the Relu output
    assert sorted(report.activation_ranges) == ["pooled", "r"]
    low, high = report.activation_ranges["r"]
    assert low == 0.0 and high > 0  # after a Relu
    nodes = read_package(dst).graph["nodes"]
    assert [n["op"] for n in nodes].count("QuantizeLinear") == 2
    fc1 = next(n for n in nodes if n["name"] == "fc1")
    assert fc1["inputs"][0] == "pooled/act_dq"
    figures = report.accuracy["outputs"]["probs"]
    assert figures["cosine_similarity"] > 0.999 and figures["top1_agreement"] >= 0.9
    assert Session(dst).self_test().passed


def test_dynamic_int8_activations_need_no_calibration(tmp_path):
    """--activations dynamic: DynamicQuantizeLinear -> DequantizeLinear on the same inputs the
    static path quantizes, measured by the accuracy report like it."""
    dst = tmp_path / "m.ferry"
    report = convert(mlp(width=64), dst, quantize="int8", activations="dynamic")
    assert report.activations == "dynamic" and report.activation_inputs == ["pooled", "r"]
    assert report.activation_ranges == {}  # computed per run, none stored
    nodes = read_package(dst).graph["nodes"]
    quantizers = [n for n in nodes if n["op"] == "DynamicQuantizeLinear"]
    assert [n["inputs"] for n in quantizers] == [["pooled"], ["r"]]
    assert quantizers[0]["outputs"] == ["pooled/act_q", "pooled/act_scale", "pooled/act_zero"]
    assert not [n for n in nodes if n["op"] == "QuantizeLinear"]
    fc1 = next(n for n in nodes if n["name"] == "fc1")
    assert fc1["inputs"][0] == "pooled/act_dq"
    figures = report.accuracy["outputs"]["probs"]
    assert report.accuracy["inputs"] == "random"
    assert figures["cosine_similarity"] > 0.999 and figures["top1_agreement"] >= 0.9
    assert Session(dst).self_test().passed


def test_a_depthwise_convs_input_stays_float_under_static_int8_activations(tmp_path):
    """Only ungrouped convs (and matmuls) get a quantize/dequantize pair: no integer kernel takes a
    grouped conv's input."""
    rng = np.random.default_rng(6)
    w1 = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    dw = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], name="pointwise"),
            helper.make_node("Conv", ["a", "dw"], ["y"], group=16, pads=[1, 1, 1, 1], name="depthwise"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(dw, "dw")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calibration = {"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    dst = tmp_path / "m.ferry"
    report = convert(model, dst, quantize="int8", calibration=calibration, activations="minmax")
    assert sorted(report.activation_ranges) == ["x"]
    nodes = {n["name"]: n for n in read_package(dst).graph["nodes"]}
    assert nodes["pointwise"]["inputs"][0] == "x/act_dq" and nodes["depthwise"]["inputs"][0] == "a"
    report = convert(model, dst, quantize="int8", activations="dynamic")  # the same inputs
    assert report.activation_inputs == ["x"]
    nodes = {n["name"]: n for n in read_package(dst).graph["nodes"]}
    assert nodes["pointwise"]["inputs"][0] == "x/act_dq" and nodes["depthwise"]["inputs"][0] == "a"


def pointwise_model(bias: np.ndarray) -> onnx.ModelProto:
    """A 1x1 conv of 64 input channels (two int4 blocks) with the given bias, then a 3x3 conv."""
    rng = np.random.default_rng(8)
    w1 = rng.standard_normal((96, 64, 1, 1)).astype(np.float32)
    w2 = rng.standard_normal((8, 96, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="pointwise"),
            helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1, 1, 1, 1], name="full"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 5])],
        initializer=[numpy_helper.from_array(a, k) for k, a in (("w1", w1), ("w2", w2), ("b1", bias))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_1x1_conv_is_dequantized_in_place_and_its_tiny_bias_stored_half_size(tmp_path):
    """int4: a 1x1 kernel's blocks lie along its axis 1, so no Reshape follows its
    DequantizeLinear (a 3x3 kernel's still does); a bias of ~1e-8 (below float16's normal
    numbers) moves the output far less than a weight step does, so it is stored float16."""
    bias = (np.random.default_rng(9).standard_normal(96) * 1e-8).astype(np.float32)
    source = pointwise_model(bias)
    dst = tmp_path / "m.ferry"
    convert(source, dst, quantize="int4")
    package = read_package(dst)
    ops = [n["op"] for n in package.graph["nodes"]]
    assert ops.count("Reshape") == 1 and ops.count("DequantizeLinear") == 2
    assert package.tensors["w1/scale"].shape == (96, 2, 1, 1)
    assert package.tensors["b1"].dtype == np.float16
    # the engine's result is the float model's on the dequantized weights (and float16 bias)
    weights = {}
    for node in package.graph["nodes"]:
        if node["op"] == "DequantizeLinear":
            q, scale, zero = (package.tensors[name] for name in node["inputs"])
            weights[node["name"].split("/")[0]] = dequantize(q, scale.astype(np.float32), zero, node["attrs"])
    w1, w2 = weights["pointwise"], weights["full"].reshape(8, 96, 3, 3)
    assert w1.shape == (96, 64, 1, 1)
    reference = pointwise_model(package.tensors["b1"].astype(np.float32))
    for tensor in reference.graph.initializer:
        if tensor.name in ("w1", "w2"):
            tensor.CopyFrom(numpy_helper.from_array({"w1": w1, "w2": w2}[tensor.name], tensor.name))
    x = np.random.default_rng(10).standard_normal((1, 64, 5, 5)).astype(np.float32)
    session = Session(dst)
    got = session.run({"x": x})["y"]
    want = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert session.self_test().passed


def test_a_tiny_bias_of_a_float_layer_stays_float32(tmp_path):
    """Without a quantized weight beside it, a bias float16 would distort keeps float32."""
    bias = (np.random.default_rng(9).standard_normal(96) * 1e-8).astype(np.float32)
    dst = tmp_path / "m.ferry"
    convert(pointwise_model(bias), dst, quantize="int4", keep_float=["pointwise"])
    assert read_package(dst).tensors["b1"].dtype == np.float32


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int8", "activations": "minmax"}, "need calibration samples"),
        ({"quantize": "fp16", "activations": "minmax", "calibration": {}}, "need quantize='int8' or 'int4'"),
        ({"quantize": "int8", "activations": "kl", "calibration": {}}, "not an int8 activation mode"),
        ({"quantize": "fp16", "activations": "dynamic"}, "dynamic int8 activations need quantize='int8'"),
        ({"activations": "dynamic"}, "need quantize='int8' or 'int4'"),
    ],
)
def test_static_activation_options_are_checked(tmp_path, options, message):
    with pytest.raises(ConversionError, match=message):
        convert(mlp(width=64), tmp_path / "m.ferry", **options)
    assert not list(tmp_path.iterdir())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 130),
    cols=st.integers(1, 9),
    block=st.sampled_from([32, 64, 128]),
    spread=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_quantization_error_is_at_most_half_a_step(rows, cols, block, spread, seed):
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * spread).astype(np.float32)
    q, scale = quant.quantize_int8(w, 1)
    assert np.all(np.abs(quant.dequantized(q, scale, None, 1, 0) - w) <= scale / 2 * (1 + 1e-5))
    q4, scale4, zero4 = quant.quantize_int4(w, block)
    restored = quant.dequantized(q4, scale4, zero4, 0, block)
    step = np.repeat(scale4.astype(np.float32), block, axis=0)[:rows]
    # half a step of rounding, plus the float16 rounding of the scale applied to up to 15 steps
    assert np.all(np.abs(restored - w) <= step * (0.5 + 15 * 2**-11) + 1e-6 * spread)
    np.testing.assert_array_equal(unpack4(quant.pack4(q4), [rows, cols], signed=False), q4)


# -- what else a quantized package holds ---------------------------------------------------------


def test_small_float_tensors_are_stored_half_size_unless_kept_float(tmp_path):
    """Biases and the int8 scales go float16 (cast back at load); a layer kept float32 keeps
    its tensors float32; the accuracy report is measured with the narrowed tensors."""
    report = convert(mlp(width=64), tmp_path / "m.ferry", quantize="int8", keep_float=("fc2",))
    package = read_package(tmp_path / "m.ferry")
    casts = package.graph["load_casts"]
    assert package.tensors["b1"].dtype == np.float16 and casts["b1"] == "float32"
    assert package.tensors["w1/scale"].dtype == np.float16 and casts["w1/scale"] == "float32"
    assert package.tensors["w2"].dtype == np.float32 and "w2" not in casts  # fc2 kept float
    assert report.accuracy["outputs"]["probs"]["cosine_similarity"] >= 0.9999
    assert Session(tmp_path / "m.ferry").self_test().passed


def test_a_float_tensor_float16_would_distort_stays_float32():
    tensors = {
        "fine": rand(8, 16),
        "huge": rand(8, 16) * 1e6,  # beyond float16's range
        "tiny": rand(8, 16) * 1e-7,  # below float16's normal numbers: most digits lost
        "short": rand(8),  # fewer than MIN_ELEMENTS: not worth it
    }
    casts: dict[str, str] = {}
    quant._narrow_floats(tensors, casts, keep=set())
    assert casts == {"fine": "float32"} and tensors["fine"].dtype == np.float16
    assert all(tensors[name].dtype == np.float32 for name in ("huge", "tiny", "short"))


def big_io_model() -> onnx.ModelProto:
    """A float input and output of 150 K elements each: the self-test vectors go compact."""
    rng = np.random.default_rng(4)
    return model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
            helper.make_node("Add", ["h", "x"], ["y"], name="residual"),
        ],
        [fvalue("x", [1, 600, 256])],
        [fvalue("y", [1, 600, 256])],
        initializers=[
            numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), "w")
        ],
    )


def test_large_self_test_vectors_are_stored_compactly_and_still_checked(tmp_path):
    from converter import selftest  # noqa: PLC0415 - it imports the engine's Session

    dst = tmp_path / "m.ferry"
    convert(big_io_model(), dst, quantize="int8")
    package = read_package(dst)
    spec = package.manifest["metadata"]["selftest"]
    codes, sample = package.tensors["selftest/input/x"], package.tensors["selftest/output/y"]
    assert codes.dtype == np.uint8 and codes.shape == (600 * 256 // 2,)  # two 4-bit codes a byte
    assert spec["input_codes"] == {"x": {"scale": 1 / selftest.GRID, "shape": [1, 600, 256]}}
    stride = spec["output_strides"]["y"]
    assert stride % 2 == 1 and sample.shape == (-(-600 * 256 // stride),)
    assert sample.size <= selftest.MAX_OUTPUT_ELEMENTS
    # the stored sample is the model's output on the decoded input
    x = unpack4(codes, [1, 600, 256], signed=True).astype(np.float32) / selftest.GRID
    assert len(np.unique(x)) == 16  # N(0, 1) on the grid: every code used
    want = Session(dst).run({"x": x})["y"].reshape(-1)[::stride]
    np.testing.assert_array_equal(sample, want)
    assert Session(dst).self_test().passed


def test_a_compact_self_test_still_catches_a_wrong_result(tmp_path):
    """Changing a weight after the self-test was recorded: the sampled output no longer matches."""
    src, dst = tmp_path / "m.ferry", tmp_path / "bad"
    convert(big_io_model(), src, quantize="int8")
    with tarfile.open(src) as archive:  # an unpacked package: loaded without re-hashing
        archive.extractall(dst, filter="data")
    graph = read_package(dst).graph
    entry = graph["tensors"]["w/scale"]
    with open(dst / "weights.bin", "r+b") as weights:
        weights.seek(entry["offset"])
        weights.write(np.full(4, 2.0, np.float16).tobytes())
    result = Session(dst).self_test()
    assert not result.passed and "output 'y'" in result.failures[0]


def test_small_self_test_vectors_stay_as_they_were(mlp_packages):
    root, _, _ = mlp_packages
    spec = read_package(root / "int8.ferry").manifest["metadata"]["selftest"]
    assert "input_codes" not in spec and "output_strides" not in spec
