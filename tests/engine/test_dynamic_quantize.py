"""Dynamic int8 activations: DynamicQuantizeLinear against onnx.reference (edge values too), its
JIT twin against it byte for byte, and a dynamic package's QMatMuls and Convs planned as
QdqMatMul / QdqConv reading the run-time scale and zero point, equal to the unfused form."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from converter import convert
from converter import quantize as quant
from engine import Session
from engine.ops.dynamic_quantize import dynamic_quantize_linear
from engine.ops.qdq_matmul import qdq_matmul
from engine.ops.quantized import dequantize, qmatmul
from tests.engine.test_int8_activations import _conv_block, _encoder_block, _jit_module


def _reference(x: np.ndarray) -> list[np.ndarray]:
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero"])],
        "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [
            helper.make_tensor_value_info("y", TensorProto.UINT8, list(x.shape)),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("zero", TensorProto.UINT8, []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, {"x": x})


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [g.dtype for g in got] == [np.uint8, np.float32, np.uint8]
    assert got[0].shape == want[0].shape and got[1].shape == got[2].shape == ()
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    np.testing.assert_array_equal(got[0], want[0])


EDGES = {
    "all zero": np.zeros((2, 5), np.float32),
    "all negative": -np.linspace(0.5, 7.0, 12, dtype=np.float32).reshape(3, 4),
    "all positive": np.linspace(0.5, 7.0, 12, dtype=np.float32).reshape(3, 4),
    "constant": np.full((4, 3), 2.75, np.float32),
    "negative constant": np.full((4, 3), -0.125, np.float32),
    "one value": np.array([[3.0]], np.float32),
    "ties": np.array([0.0, 255.0, 0.5, 1.5, 2.5, -0.5, 254.5], np.float32),  # scale 1: halves
    "tiny": np.array([1e-30, -1e-30, 0.0], np.float32),
    "huge": np.array([1.5e38, -1.5e38, 1.0], np.float32),  # a range near float32's largest
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_values_match_the_onnx_reference(name):
    x = EDGES[name]
    want = _reference(x)
    _assert_same(dynamic_quantize_linear([x], {}), want)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=9),
        # no subnormals: a range of a few of them makes the float32 scale 0, and the zero point
        # -low / 0 a NaN, whose cast to uint8 onnx.reference leaves to the platform
        elements=st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False),
    )
)
def test_dynamic_quantize_linear_matches_the_onnx_reference(x):
    _assert_same(dynamic_quantize_linear([x], {}), _reference(x))


@pytest.mark.parametrize("name", sorted(EDGES))
def test_the_jit_kernel_gives_numpys_bytes_on_edge_values(name):
    _, module = _jit_module()
    x = EDGES[name]
    _assert_same(module.dynamic_quantize_linear_jit([x], {}), dynamic_quantize_linear([x], {}))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.floats(-3, 3), st.booleans(), st.integers(0, 2**31))
def test_the_jit_kernel_gives_numpys_bytes_in_the_inputs_layout(size, shift, channels_last, seed):
    _, module = _jit_module()
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, 3, size, 2)) * 4 + shift).astype(np.float32)
    if channels_last:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    got = module.dynamic_quantize_linear_jit([x], {})
    _assert_same(got, dynamic_quantize_linear([x], {}))
    if channels_last:  # the next integer conv reads it without a transposing copy
        assert got[0].transpose(0, 2, 3, 1).flags.c_contiguous


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 23),  # rows
    st.integers(1, 70),  # k
    st.integers(1, 150),  # n
    st.floats(-2, 2),  # a shift of the activations: zero points across 0..255
    st.booleans(),
    st.integers(0, 2**31),
)
def test_the_integer_gemm_on_run_time_parameters_matches_the_unfused_form(rows, k, n, shift, bias, seed):
    _, module = _jit_module()
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, rows, k)) + shift).astype(np.float32)
    q, a_scale, a_zero = module.dynamic_quantize_linear_jit([x], {})
    w, w_scale = quant.quantize_int8(rng.standard_normal((k, n)).astype(np.float32), axis=1)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    inputs = [q, a_scale, a_zero, w, w_scale, None, b]
    unfused = qmatmul([dequantize(q, a_scale, a_zero, {}), w, w_scale, None, b], {"axis": 1})[0]
    np.testing.assert_array_equal(qdq_matmul(inputs, {"axis": 1})[0], unfused)
    got = module.qdq_matmul_jit(inputs, {"axis": 1})[0]
    scale = max(1.0, float(np.abs(unfused).max()))
    np.testing.assert_allclose(got / scale, unfused / scale, atol=1e-5)


@pytest.mark.parametrize("use_jit", [True, False])
def test_a_dynamic_int8_package_plans_its_matmuls_as_integer_products(tmp_path, use_jit, monkeypatch):
    monkeypatch.setenv("FERRY_INT8_FUSION", "1")  # whatever this CPU's integer GEMM measures
    if use_jit:
        _jit_module()
    model, feeds = _encoder_block(3)
    package = tmp_path / "block.ferry"
    convert(model, package, quantize="int8", activations="dynamic")
    session = Session(package, threads=1, jit=use_jit)
    first = {name: value.copy() for name, value in session.run(feeds).items()}  # node by node
    session.run(feeds)  # plans
    timings = session.profile(feeds)
    fused = [t for t in timings if t.op == "QdqMatMul"]
    assert len(fused) == 3, [(t.op, t.kernel) for t in timings]
    assert all(t.kernel.startswith("int8_gemm_jit." if use_jit else "qdq_matmul.") for t in fused)
    assert not [t for t in timings if t.op == "DequantizeLinear"]
    quantizers = [t for t in timings if t.op == "DynamicQuantizeLinear"]
    assert len(quantizers) == 2  # x once for both readers
    if use_jit:
        assert all(t.kernel == "int8_gemm_jit.dynamic_quantize_linear_jit" for t in quantizers)
    planned = session.run(feeds)
    for name, value in first.items():
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(planned[name] / scale, value / scale, atol=1e-5)


def test_a_dynamic_int8_cnn_plans_its_convolutions_as_integer_products(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_INT8_FUSION", "1")  # whatever this CPU's integer GEMM measures
    _jit_module()
    model, feeds = _conv_block(4)
    package = tmp_path / "block.ferry"
    convert(model, package, quantize="int8", activations="dynamic")
    session = Session(package, threads=1)
    first = session.run(feeds)["y"].copy()
    session.run(feeds)
    timings = session.profile(feeds)
    assert [t.op for t in timings].count("QdqConv") == 2, [(t.op, t.kernel) for t in timings]
    assert not [t for t in timings if t.op in ("DequantizeLinear", "Conv", "FusedConv")]
    planned = session.run(feeds)["y"]
    top = np.abs(first).max()
    np.testing.assert_allclose(planned / top, first / top, atol=1e-5)
    unfused = Session(package, threads=1, jit=False).run(feeds)["y"]
    np.testing.assert_allclose(planned / top, unfused / top, atol=1e-5)
