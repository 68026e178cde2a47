"""The converter's fold of a LayerNorm's scale and bias into the MatMuls reading it
(``fold_layer_norm_affine``), against onnxruntime.  (The attention scale's fold into the q
projection is checked with the head-split views in test_transformer_kernels.py.)"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from converter import convert
from engine import Session
from engine.format import read_package
from tests.converter.models import fvalue, model


def _layer_norm_then_matmuls(seed: int, rows: int, width: int, outs: list[int], shared: bool, extra: bool):
    """LayerNorm (random scale and bias) -> MatMul + Add by each of ``outs`` widths, summed
    into outputs; ``shared``: the first two MatMuls use one weight; ``extra``: the LayerNorm
    output is also read by a Relu (not a MatMul)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((1 + 0.3 * rng.standard_normal(width)).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "shift"),
    ]
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "shift"], ["n"], axis=-1)]
    outputs = []
    for i, n in enumerate(outs):
        weight = "w0" if shared and i == 1 else f"w{i}"
        n = outs[0] if weight == "w0" else n
        if weight == f"w{i}":
            inits.append(numpy_helper.from_array(rng.standard_normal((width, n)).astype(np.float32), weight))
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}"))
        nodes += [
            helper.make_node("MatMul", ["n", weight], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"]),
        ]
        outputs.append(fvalue(f"y{i}", [1, rows, n]))
    if extra:
        nodes.append(helper.make_node("Relu", ["n"], ["r"]))
        outputs.append(fvalue("r", [1, rows, width]))
    return model(nodes, [fvalue("x", [1, rows, width])], outputs, initializers=inits)


def _compare(source: onnx.ModelProto, path, shape) -> None:
    feeds = {"x": (np.random.default_rng(1).standard_normal(shape) * 2 + 0.5).astype(np.float32)}
    onnxruntime = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    want = onnxruntime.run(None, feeds)
    session = Session(path, threads=1)
    for _ in range(2):  # the recorded run and the planned run
        got = session.run(feeds)
        for spec, expected in zip(source.graph.output, want, strict=True):
            np.testing.assert_allclose(got[spec.name], expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 2**16),
    st.integers(1, 20),
    st.integers(2, 24),
    st.lists(st.integers(1, 30), min_size=1, max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_layer_norm_affine_folds_into_its_matmuls(tmp_path_factory, seed, rows, width, outs, shared, extra):
    source = _layer_norm_then_matmuls(seed, rows, width, outs, shared, extra)
    path = tmp_path_factory.mktemp("ln") / "ln.ferry"
    convert(source, path)
    package = read_package(path)
    norm = next(node for node in package.graph["nodes"] if node["op"] == "LayerNormalization")
    folded = not extra and not (shared and len(outs) > 1)
    assert bool(np.all(package.tensors[norm["inputs"][1]] == 1)) == folded
    assert (len(norm["inputs"]) == 2) == folded
    _compare(source, path, (1, rows, width))


@pytest.mark.parametrize("broadcast", ["scale", "shift"])
def test_a_broadcast_layer_norm_parameter_is_left_unfolded(tmp_path, broadcast):
    """A [1] scale or bias (broadcast over the row) is valid ONNX: the LayerNorm keeps it."""
    rng = np.random.default_rng(3)
    params = {"scale": rng.standard_normal(8), "shift": rng.standard_normal(8)}
    params[broadcast] = params[broadcast][:1]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    inits.append(numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w"))
    nodes = [
        helper.make_node("LayerNormalization", ["x", "scale", "shift"], ["n"], axis=-1),
        helper.make_node("MatMul", ["n", "w"], ["y"]),
    ]
    source = model(nodes, [fvalue("x", [1, 4, 8])], [fvalue("y", [1, 4, 5])], initializers=inits)
    path = tmp_path / "ln.ferry"
    convert(source, path)
    norm = next(node for node in read_package(path).graph["nodes"] if node["op"] == "LayerNormalization")
    assert len(norm["inputs"]) == 3
    _compare(source, path, (1, 4, 8))
