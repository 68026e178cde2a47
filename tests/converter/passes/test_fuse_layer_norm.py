"""The fuse_layer_norm pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import pytest
from onnx import helper

from converter.passes import fuse_layer_norm
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import check_pass, const, ops, rand


def test_fuse_layer_norm(tmp_path):
    m = model(
        [
            helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
            helper.make_node("Sub", ["x", "mean"], ["c"]),
            helper.make_node("Pow", ["c", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["std"]),
            helper.make_node("Div", ["c", "std"], ["n"]),
            helper.make_node("Mul", ["n", "gamma"], ["s"]),
            helper.make_node("Add", ["s", "beta"], ["y"]),
        ],
        [fvalue("x", [2, 5, 16])],
        [fvalue("y", [2, 5, 16])],
        initializers=[
            const("two", 2.0),
            const("eps", 1e-5),
            const("gamma", rand(16)),
            const("beta", rand(16)),
        ],
    )
    graph = check_pass(tmp_path, m, fuse_layer_norm.run, {"x": rand(2, 5, 16)})
    assert ops(graph) == ["LayerNormalization"]
    assert graph.nodes[0]["attrs"] == {"axis": -1, "epsilon": pytest.approx(1e-5)}
