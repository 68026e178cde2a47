"""The fuse_attention pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from converter.passes import fuse_attention
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import RNG, check_pass, const, ops, rand


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("scaling", ["Mul", "Div"])
def test_fuse_attention(tmp_path, masked, scaling):
    factor = 0.125 if scaling == "Mul" else 8.0
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node(scaling, ["scores", "factor"], ["scaled"]),
    ]
    if masked:
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
    nodes += [
        helper.make_node("Softmax", ["masked" if masked else "scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"]),
    ]
    inputs = [fvalue("q", [2, 3, 5, 8]), fvalue("k", [2, 3, 7, 8]), fvalue("v", [2, 3, 7, 4])]
    mask = np.where(RNG.random((1, 1, 5, 7)) < 0.3, -1e9, 0.0)
    m = model(
        nodes,
        inputs,
        [fvalue("y", [2, 3, 5, 4])],
        initializers=[const("factor", factor), const("mask", mask)],
    )
    feeds = {"q": rand(2, 3, 5, 8), "k": rand(2, 3, 7, 8), "v": rand(2, 3, 7, 4)}
    graph = check_pass(tmp_path, m, fuse_attention.run, feeds)
    assert ops(graph) == ["FusedAttention"]
    assert graph.nodes[0]["attrs"] == {"scale": 0.125, "k_transposed": 0}
    assert len(graph.nodes[0]["inputs"]) == (4 if masked else 3)
