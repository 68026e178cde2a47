"""The fuse_matmul_add pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import pytest
from onnx import helper

from converter.passes import fuse_matmul_add
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import check_pass, const, ops, rand


@pytest.mark.parametrize(("shape", "fused"), [([4, 8], "Gemm"), ([2, 4, 8], "FusedMatMul")])
def test_fuse_matmul_add(tmp_path, shape, fused):
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        [fvalue("x", shape)],
        [fvalue("y", [*shape[:-1], 5])],
        initializers=[const("w", rand(8, 5)), const("b", rand(5))],
    )
    graph = check_pass(tmp_path, m, fuse_matmul_add.run, {"x": rand(*shape)})
    assert ops(graph) == [fused]
