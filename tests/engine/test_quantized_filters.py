"""int8/int4 convolution filters are dequantized once, at planning, while quantized matrices
stay lazy; and a kernel choice cached among fewer candidates is measured again."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from converter import convert
from engine import Session, search
from tests.engine.helpers import run_reference


def _conv_net(seed: int):
    """Conv -> Relu -> Conv (3x3 and 1x1), then a MatMul: each weight large enough to quantize."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2,
        "w2": rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.2,
        "m": rng.standard_normal((16 * 6 * 6, 32)).astype(np.float32) * 0.05,
        "shape": np.array([1, -1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Reshape", ["c2", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "m"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        initializer=[numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((1, 8, 6, 6)).astype(np.float32)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_quantized_filter_is_dequantized_once_and_a_quantized_matrix_stays_lazy(tmp_path, precision):
    model, x = _conv_net(1)
    package = tmp_path / f"net-{precision}.ferry"
    convert(model, package, quantize=precision)
    session = Session(package, threads=1)
    first = session.run({"x": x})["y"].copy()  # the recorded run: every node, filters dequantized
    session.run({"x": x})  # builds the plan
    planned = session.profile({"x": x})

    ops = [timing.op for timing in planned]
    assert "DequantizeLinear" not in ops, ops  # folded into the conv's (packed) filter
    assert ops.count("Conv") + ops.count("FusedConv") == 2, ops
    assert "QMatMul" in ops, ops  # the matrix stays quantized, dequantized as it is used
    # the planned kernels (the search's, per CPU) sum in another order than the recorded run's
    np.testing.assert_allclose(session.run({"x": x})["y"], first, rtol=1e-5, atol=1e-5)
    expected = run_reference(model, {"x": x})[0]  # float32 weights: only quantization error
    error = np.abs(first - expected).max() / np.abs(expected).max()
    assert error < (0.02 if precision == "int8" else 0.3), error  # int4: 16 levels, random weights


def test_a_choice_cached_among_fewer_kernels_is_measured_again(tmp_path, monkeypatch):
    """An engine upgrade that adds a kernel (or makes weights packable) re-measures the node."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(cache))
    model, x = _conv_net(2)
    package = tmp_path / "net.ferry"
    convert(model, package)
    assert any(t.note.startswith("searched: ") for t in Session(package, threads=1).profile({"x": x}))
    [written] = list(cache.iterdir())
    choices = json.loads(written.read_text())
    among = [key for key in choices if key.endswith(search.AMONG)]
    assert among and all(len(choices[key]) == 16 for key in among)

    notes = [t.note for t in Session(package, threads=1).profile({"x": x}) if t.note.startswith("searched")]
    assert notes and all(note == "searched, cached" for note in notes), notes

    # as an older engine wrote it: the same choices, no record of the candidates
    written.write_text(json.dumps({k: v for k, v in choices.items() if not k.endswith(search.AMONG)}))
    notes = [t.note for t in Session(package, threads=1).profile({"x": x}) if t.note.startswith("searched")]
    assert notes and all(note.startswith("searched: ") for note in notes), notes
