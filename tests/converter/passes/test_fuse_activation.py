"""The fuse_activation pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import pytest
from onnx import helper

from converter.passes import fuse_activation
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import check_pass, const, ops, rand


@pytest.mark.parametrize(
    ("activation", "extra_inputs", "attrs"),
    [
        ("Relu", [], {}),
        ("Clip", ["zero", "six"], {}),
        ("HardSwish", [], {}),
        ("Sigmoid", [], {}),
        ("LeakyRelu", [], {"alpha": 0.2}),
    ],
)
@pytest.mark.parametrize("base", ["Conv", "Gemm", "MatMul"])
def test_fuse_activation(tmp_path, base, activation, extra_inputs, attrs):
    if base == "Conv":
        x_shape, y_shape, w = [1, 3, 5, 5], [1, 4, 5, 5], rand(4, 3, 3, 3)
        base_node = helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1])
    else:
        x_shape, y_shape, w = [3, 6], [3, 4], rand(6, 4)
        base_node = helper.make_node(base, ["x", "w"], ["h"])
    m = model(
        [base_node, helper.make_node(activation, ["h", *extra_inputs], ["y"], **attrs)],
        [fvalue("x", x_shape)],
        [fvalue("y", y_shape)],
        initializers=[const("w", w), const("zero", 0.0), const("six", 6.0)],
    )
    graph = check_pass(tmp_path, m, fuse_activation.run, {"x": rand(*x_shape) * 4})
    assert ops(graph) == [f"Fused{base}"]
    assert graph.nodes[0]["attrs"]["activation"] == activation
