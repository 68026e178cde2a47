"""Static int8 activations in integers: QuantizeLinear -> DequantizeLinear -> QMatMul / Conv
planned as one QdqMatMul / QdqConv, their JIT kernels (uint8 x int8 sums in int32) against the
unfused numpy form and an exact reference, with and without the CPU's VNNI instruction, and
QuantizeLinear in one pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter import convert
from converter import quantize as quant
from engine import Session
from engine.ops.fused import apply_activation
from engine.ops.qdq_matmul import qdq_matmul

ROOT = Path(__file__).resolve().parents[2]


def _jit_module():
    pytest.importorskip("numba")
    from engine import jit  # noqa: PLC0415 - only with the JIT tier

    if not jit.enabled():
        pytest.skip("the JIT tier is turned off (FERRY_JIT=0)")
    return jit, jit.module("engine.ops.int8_gemm_jit")


def _operands(rows: int, k: int, n: int, zero: int, with_bias: bool, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, (1, rows, k), dtype=np.uint8)
    q.reshape(-1)[0], q.reshape(-1)[-1] = 0, 255  # the uint8 extremes
    w, w_scale = quant.quantize_int8(rng.standard_normal((k, n)).astype(np.float32), axis=1)
    w[0, 0] = -127
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    return [q, np.array(0.02, np.float32), np.array(zero, np.uint8), w, w_scale, None, bias]


def _exact(inputs: list, attrs: dict) -> np.ndarray:
    """a_scale * w_scale * (the integer sum of (q - zero) * w) + bias, in float64."""
    q, a_scale, a_zero, w, w_scale, _, bias = inputs
    sums = (q.astype(np.int64) - int(a_zero)) @ w.astype(np.int64)
    y = sums * (float(a_scale) * w_scale.astype(np.float64)) + (0 if bias is None else bias)
    return apply_activation(y.astype(np.float32), attrs)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 23),  # rows: tiles of 4 and a part of one
    st.integers(1, 70),  # k: not only multiples of 4
    st.integers(1, 150),  # n: tiles of 64 columns and a part of one
    st.integers(0, 255),  # the activations' zero point
    st.booleans(),
    st.sampled_from([None, "Relu", "Gelu"]),
    st.integers(0, 2**31),
)
def test_the_integer_kernel_matches_the_unfused_form_and_the_exact_sum(
    rows, k, n, zero, with_bias, activation, seed
):
    jit, module = _jit_module()
    inputs = _operands(rows, k, n, zero, with_bias, seed)
    attrs = {"axis": 1, **({"activation": activation} if activation else {})}
    want = _exact(inputs, attrs)
    unfused = qdq_matmul(inputs, attrs)[0]
    got = module.qdq_matmul_jit(inputs, attrs)[0]
    assert got.shape == want.shape == (1, rows, n) and got.dtype == np.float32
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-6)
    np.testing.assert_allclose(got / scale, unfused / scale, atol=1e-5)
    packed = dict(enumerate(inputs)) | module.pack(inputs, attrs)
    planned = module.qdq_matmul_jit([packed[i] for i in range(len(inputs))], attrs)[0]
    np.testing.assert_array_equal(planned, got)  # packed once at planning: the same bits
    with jit.thread_limit(2):
        np.testing.assert_array_equal(module.qdq_matmul_jit(inputs, attrs)[0], got)


def test_operands_the_integer_kernel_does_not_take_go_to_the_unfused_form():
    jit, module = _jit_module()
    inputs = _operands(3, 8, 5, 7, True, 1)
    weight_zero = [*inputs[:5], np.full(5, 2, np.int8), inputs[6]]
    assert module.pack(weight_zero, {"axis": 1}) == {}
    np.testing.assert_array_equal(
        module.qdq_matmul_jit(weight_zero, {"axis": 1})[0], qdq_matmul(weight_zero, {"axis": 1})[0]
    )


# numba compiling for another CPU: skylake-avx512 has AVX-512 but no VNNI (the generic IR);
# haswell (features named: int_dot_ir takes a named CPU as generic otherwise) the AVX2 path
WITHOUT_VNNI = {
    "generic": {"NUMBA_CPU_NAME": "skylake-avx512"},
    "avx2": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,+bmi2"},
}


def _host_has(feature: str) -> bool:
    import llvmlite.binding as llvm  # noqa: PLC0415 - only with the JIT tier

    return bool(llvm.get_host_cpu_features().get(feature, False))


@pytest.mark.parametrize("path", sorted(WITHOUT_VNNI))
def test_the_kernel_compiled_for_a_cpu_without_vnni_gives_the_same_sums(tmp_path, path):
    """Generic LLVM IR or AVX2's vpmaddwd where the CPU lacks AVX-512 VNNI: the same exact
    integer sums, the uint8 and int8 extremes included."""
    _jit_module()
    if path == "avx2" and not _host_has("avx2"):
        pytest.skip("code compiled for AVX2 cannot run on this CPU")
    script = (
        "import numpy as np\n"
        "from engine import jit\n"
        "m = jit.module('engine.ops.int8_gemm_jit')\n"
        f"assert m.int_dot_ir.PATH == {path!r}, m.int_dot_ir.PATH\n"
        "rng = np.random.default_rng(5)\n"
        "q = rng.integers(0, 256, (9, 37), dtype=np.uint8)\n"
        "w = rng.integers(-128, 128, (37, 70), dtype=np.int8)\n"
        "q[0], w[:, 0], q[1], w[:, 1] = 255, -128, 255, 127\n"
        "ones = np.ones(70, np.float32)\n"
        "inputs = [q, np.array(1, np.float32), np.array(0, np.uint8), w, ones, None, None]\n"
        "got = m.qdq_matmul_jit(inputs, {})[0]\n"
        "assert np.array_equal(got, (q.astype(np.int64) @ w.astype(np.int64)).astype(np.float32))\n"
        "print('exact ok')\n"
    )
    env = {
        **os.environ,
        **WITHOUT_VNNI[path],
        "FERRY_JIT_CACHE": str(tmp_path / "jit"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "exact ok" in done.stdout, done.stderr[-2000:]


def _encoder_block(seed: int):
    """x -> MatMul(+bias) -> Relu -> MatMul, and x read by a second projection (one quantized
    value shared by two QMatMuls)."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((32, 64)).astype(np.float32) * 0.2,
        "b1": rng.standard_normal(64).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((64, 32)).astype(np.float32) * 0.2,
        "w3": rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
        helper.make_node("MatMul", ["x", "w3"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 32])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 10, 32]) for name in ("y", "z")],
        initializer=[numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 10, 32)).astype(np.float32)}


@pytest.mark.parametrize("use_jit", [True, False])
def test_a_static_int8_package_plans_its_matmuls_as_integer_products(tmp_path, use_jit, monkeypatch):
    monkeypatch.setenv("FERRY_INT8_FUSION", "1")  # whatever this CPU's integer GEMM measures
    if use_jit:
        _jit_module()
    model, feeds = _encoder_block(3)
    package = tmp_path / "block.ferry"
    convert(model, package, quantize="int8", activations="minmax", calibration=feeds)
    session = Session(package, threads=1, jit=use_jit)
    first = {name: value.copy() for name, value in session.run(feeds).items()}  # node by node
    session.run(feeds)  # plans
    timings = session.profile(feeds)
    fused = [t for t in timings if t.op == "QdqMatMul"]
    assert len(fused) == 3, [(t.op, t.kernel) for t in timings]
    assert all(t.kernel.startswith("int8_gemm_jit." if use_jit else "qdq_matmul.") for t in fused)
    assert not [t for t in timings if t.op == "DequantizeLinear"]  # read by QdqMatMuls only
    assert len([t for t in timings if t.op == "QuantizeLinear"]) == 2  # x once for both readers
    planned = session.run(feeds)
    for name, value in first.items():
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(planned[name] / scale, value / scale, atol=1e-5)


def test_where_integer_products_do_not_pay_the_unfused_form_is_planned(tmp_path, monkeypatch):
    """The safety net: a CPU whose integer GEMM measured slower than the float form keeps
    QuantizeLinear -> DequantizeLinear -> QMatMul as they are, with the same results."""
    _jit_module()
    from engine import fuse_qdq  # noqa: PLC0415

    monkeypatch.delenv("FERRY_INT8_FUSION", raising=False)
    monkeypatch.setattr(fuse_qdq, "_measured_to_pay", lambda: False)
    monkeypatch.setattr(fuse_qdq.jit, "has_vnni", lambda: False)
    model, feeds = _encoder_block(4)
    package = tmp_path / "block.ferry"
    convert(model, package, quantize="int8", activations="minmax", calibration=feeds)
    session = Session(package, threads=1, jit=True)
    first = {name: value.copy() for name, value in session.run(feeds).items()}
    session.run(feeds)
    ops = [t.op for t in session.profile(feeds)]
    assert "QdqMatMul" not in ops and ops.count("QMatMul") == 3 and "DequantizeLinear" in ops
    planned = session.run(feeds)
    for name, value in first.items():
        np.testing.assert_allclose(planned[name], value, rtol=1e-6, atol=1e-6)
    monkeypatch.setenv("FERRY_INT8_FUSION", "0")
    assert not fuse_qdq.integer_products_pay()
    monkeypatch.setenv("FERRY_INT8_FUSION", "1")
    assert fuse_qdq.integer_products_pay()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_float_models_jit_session_never_loads_numba_for_the_fusion_probe(tmp_path, threads):
    """A float model with nothing to fuse plans without the integer probe: on a CPU without VNNI
    the probe compiled the integer GEMM and put numba (~120 MB of peak RSS) into a session whose
    model needs no JIT kernel (the GPT decode step: 273 MB against onnxruntime's 234).  Nor does
    a 2-thread session load the team's kernels where it loads no JIT kernel of its own.  Run in
    a fresh process, as a device's agent would, since this one has numba loaded already."""
    pytest.importorskip("numba")
    model, feeds = _encoder_block(7)
    package = tmp_path / "block.ferry"
    convert(model, package)
    np.save(tmp_path / "x.npy", feeds["x"])
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from engine import Session\n"
        f"session = Session({str(package)!r}, threads={threads}, jit=True)\n"
        f"feeds = {{'x': np.load({str(tmp_path / 'x.npy')!r})}}\n"
        "results = [session.run(feeds) for _ in range(4)]\n"  # recorded, planned, then plan runs
        "assert all(np.allclose(r['y'], results[0]['y'], rtol=1e-5, atol=1e-5) for r in results)\n"
        "print('numba loaded:', 'numba' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "FERRY_JIT_CACHE": str(tmp_path / "jit"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("FERRY_INT8_FUSION", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "numba loaded: False" in done.stdout, done.stdout


def test_the_device_probe_times_both_forms():
    _jit_module()
    from engine import fuse_qdq  # noqa: PLC0415

    integer, floating = fuse_qdq._probe_seconds()
    assert 0 < integer < 1 and 0 < floating < 1


# -- convolutions: QdqConv ------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 9),  # input channels
    st.sampled_from([(1, 1), (3, 3), (1, 3), (5, 5)]),  # kernel
    st.integers(1, 2),  # stride
    st.integers(0, 2),  # padding
    st.integers(1, 2),  # dilation
    st.integers(6, 13),  # image side
    st.booleans(),  # bias
    st.booleans(),  # residual
    st.sampled_from([None, "Relu"]),
    st.integers(1, 2),  # images in the batch
    st.integers(0, 2**31),
)
def test_the_integer_conv_matches_the_unfused_form(
    channels, kernel, stride, pad, dilation, side, with_bias, with_residual, activation, images, seed
):
    jit, _ = _jit_module()
    module = jit.module("engine.ops.int8_conv_jit")
    from engine.ops.qdq_conv import MIN_WIDTH, qdq_conv  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    out_channels = MIN_WIDTH + int(rng.integers(0, 70))
    taps = kernel[0] * kernel[1]
    channels = max(channels, -(-MIN_WIDTH // taps))  # a filter wide enough to be fused
    q = rng.integers(0, 256, (images, channels, side, side), dtype=np.uint8)
    w, w_scale = quant.quantize_int8(
        rng.standard_normal((out_channels, channels, *kernel)).astype(np.float32), 0
    )
    attrs = {
        "kernel_shape": list(kernel),
        "strides": [stride, stride],
        "pads": [pad] * 4,
        "dilations": [dilation, dilation],
        **({"activation": activation} if activation else {}),
    }
    span = [(side + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for k in kernel]
    if min(span) < 1:
        return
    bias = rng.standard_normal(out_channels).astype(np.float32) if with_bias else None
    residual = (
        rng.standard_normal((images, out_channels, *span)).astype(np.float32) if with_residual else None
    )
    inputs = [
        q,
        np.array(0.05, np.float32),
        np.array(rng.integers(0, 256), np.uint8),
        w,
        w_scale,
        bias,
        residual,
    ]
    want = qdq_conv(inputs, attrs)[0]
    got = module.qdq_conv_jit(inputs, attrs)[0]
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-5)
    packed = dict(enumerate(inputs)) | module.pack(inputs, attrs)
    planned = module.qdq_conv_jit([packed.get(i) for i in range(8)], attrs)[0]
    np.testing.assert_array_equal(planned, got)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(0, 255), st.booleans(), st.integers(0, 2**31))
def test_quantizing_in_one_pass_gives_numpys_bytes_in_the_inputs_layout(size, zero, channels_last, seed):
    _, module = _jit_module()
    from engine.ops.quantized import quantize_linear  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, 3, size, 2)) * 4).astype(np.float32)
    x.reshape(-1)[0] = 2.5 * 0.1  # a tie: rounds to even
    if channels_last:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    inputs = [x, np.array(0.1, np.float32), np.array(zero, np.uint8)]
    got = module.quantize_linear_jit(inputs, {})[0]
    np.testing.assert_array_equal(got, quantize_linear(inputs, {})[0])
    if channels_last:  # the next integer conv reads it without a transposing copy
        assert got.transpose(0, 2, 3, 1).flags.c_contiguous


def _conv_block(seed: int):
    """conv 3x3 (64 -> 64) -> Relu -> conv 3x3 + the block's input (a ResNet basic block)."""
    rng = np.random.default_rng(seed)
    inits = {name: rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05 for name in ("w1", "w2")}
    inits["b1"] = rng.standard_normal(64).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 10, 10])],
        initializer=[numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": np.abs(rng.standard_normal((1, 64, 10, 10))).astype(np.float32)}


def test_a_static_int8_cnn_plans_its_convolutions_as_integer_products(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_INT8_FUSION", "1")  # whatever this CPU's integer GEMM measures
    _jit_module()
    model, feeds = _conv_block(4)
    package = tmp_path / "block.ferry"
    convert(model, package, quantize="int8", activations="minmax", calibration=feeds)
    session = Session(package, threads=1)
    first = session.run(feeds)["y"].copy()
    session.run(feeds)
    timings = session.profile(feeds)
    assert [t.op for t in timings].count("QdqConv") == 2, [(t.op, t.kernel) for t in timings]
    assert not [t for t in timings if t.op in ("DequantizeLinear", "Conv", "FusedConv")]
    planned = session.run(feeds)["y"]
    np.testing.assert_allclose(planned / np.abs(first).max(), first / np.abs(first).max(), atol=1e-5)
    float_result = Session(package, threads=1, jit=False).run(feeds)["y"]  # numpy: unfused
    np.testing.assert_allclose(planned / np.abs(first).max(), float_result / np.abs(first).max(), atol=1e-5)
