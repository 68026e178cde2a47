"""The simplify_transposes pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

from onnx import helper

from converter.passes import simplify_transposes
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import check_pass, ops, rand


def test_transpose_pairs_cancel_or_compose(tmp_path):
    m = model(
        [
            helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]),
            helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),
            helper.make_node("Relu", ["t2"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t3"], perm=[1, 0, 2]),
            helper.make_node("Transpose", ["t3"], ["y"], perm=[0, 2, 1]),
        ],
        [fvalue("x", [2, 3, 4])],
        [fvalue("y", [3, 4, 2])],
    )
    graph = check_pass(tmp_path, m, simplify_transposes.run, {"x": rand(2, 3, 4)})
    assert ops(graph) == ["Relu", "Transpose"]
