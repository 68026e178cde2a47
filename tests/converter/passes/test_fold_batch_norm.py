"""The fold_batch_norm pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from converter.passes import fold_batch_norm
from converter.translate import translate
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import RNG, check_pass, const, ops, rand


def test_fold_batch_norm_into_conv(tmp_path):
    m = model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
        ],
        [fvalue("x", [1, 3, 6, 6])],
        [fvalue("y", [1, 4, 6, 6])],
        initializers=[
            const("w", rand(4, 3, 3, 3)),
            const("b", rand(4)),
            const("scale", RNG.random(4) + 0.5),
            const("bias", rand(4)),
            const("mean", rand(4)),
            const("var", RNG.random(4) + 0.5),
        ],
    )
    graph = check_pass(tmp_path, m, fold_batch_norm.run, {"x": rand(1, 3, 6, 6)})
    assert ops(graph) == ["Conv"]


@pytest.mark.parametrize("group", [1, 2])
def test_fold_batch_norm_into_conv_transpose(tmp_path, group):
    """A decoder's upsampling layer: ConvTranspose's weight is (C, M/group, k...), so each
    output channel's factor scales axis 1 within its group."""
    m = model(
        [
            helper.make_node("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2], pads=[1] * 4, group=group),
            helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
        ],
        [fvalue("x", [1, 4, 5, 5])],
        [fvalue("y", [1, 6, 10, 10])],
        initializers=[
            const("w", rand(4, 6 // group, 4, 4)),
            const("scale", RNG.random(6) + 0.5),
            const("bias", rand(6)),
            const("mean", rand(6)),
            const("var", RNG.random(6) + 0.5),
        ],
    )
    graph = check_pass(tmp_path, m, fold_batch_norm.run, {"x": rand(1, 4, 5, 5)})
    assert ops(graph) == ["ConvTranspose"]


def test_batch_norm_in_training_mode_is_not_folded(tmp_path):
    m = model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], training_mode=1),
        ],
        [fvalue("x", [1, 2, 4, 4])],
        [fvalue("y", [1, 3, 4, 4])],
        initializers=[const("w", rand(3, 2, 1, 1)), *(const(n, RNG.random(3) + 0.5) for n in "sbmv")],
    )
    graph = fold_batch_norm.run(translate(onnx.shape_inference.infer_shapes(m), 17))
    assert ops(graph) == ["Conv", "BatchNormalization"]
