"""The simplify_reshapes pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from converter.passes import simplify_reshapes
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import check_pass, ops, rand


def test_reshape_chains_collapse(tmp_path):
    shape = lambda name, dims: numpy_helper.from_array(np.array(dims, np.int64), name)  # noqa: E731
    m = model(
        [
            helper.make_node("Reshape", ["x", "s1"], ["r1"]),
            helper.make_node("Reshape", ["r1", "s2"], ["y"]),
        ],
        [fvalue("x", [2, 3, 4])],
        [fvalue("y", [4, 6])],
        initializers=[shape("s1", [6, 4]), shape("s2", [4, -1])],
    )
    graph = check_pass(tmp_path, m, simplify_reshapes.run, {"x": rand(2, 3, 4)})
    assert ops(graph) == ["Reshape"]
