"""The whole optimization pipeline: a transformer block end to end, and every prefix of PASSES
on real models, against onnxruntime on the original model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from converter import convert, optimize
from converter.translate import translate
from engine import Session
from engine.format import read_package
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import const, rand
from tests.model_packages import write_package


def transformer_block() -> onnx.ModelProto:
    """LayerNorm, then MatMul+Add, GELU, MatMul+Add, as PyTorch exports them."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["c"]),
        helper.make_node("Pow", ["c", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["c", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["ln"]),
        helper.make_node("MatMul", ["ln", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Div", ["hb", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["hb", "e1"], ["he"]),
        helper.make_node("Mul", ["he", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["y"]),
    ]
    return model(
        nodes,
        [fvalue("x", ["batch", 5, 16])],
        [fvalue("y", ["batch", 5, 16])],
        initializers=[
            const("two", 2.0),
            const("eps", 1e-5),
            const("gamma", rand(16)),
            const("beta", rand(16)),
            const("w1", rand(16, 32) * 0.3),
            const("b1", rand(32)),
            const("w2", rand(32, 16) * 0.3),
            const("b2", rand(16)),
            const("sqrt2", np.sqrt(2)),
            const("one", 1.0),
            const("half", 0.5),
        ],
    )


def test_whole_pipeline_on_a_transformer_block_matches_onnxruntime(tmp_path):
    """Every pass in PASSES, then the engine vs onnxruntime."""
    m = transformer_block()
    dst = tmp_path / "block.ferry"
    report = convert(m, dst)
    nodes = read_package(dst).graph["nodes"]
    assert [n["op"] for n in nodes] == ["LayerNormalization", "FusedMatMul", "FusedMatMul"]
    assert nodes[1]["attrs"]["activation"] == "Gelu"  # the fused GELU then fused into the MatMul
    assert [p["pass"] for p in report.passes] == [p.__name__ for p in optimize.PASSES]
    assert report.passes[-1]["nodes"] == 3 and report.nodes_before == 18
    assert report.dynamic_inputs == ["x"]
    x = rand(3, 5, 16)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(Session(dst).run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def pipeline_models() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    from converter.samples import build_image_classifier
    from tests.converter.models import opset9_cnn

    upgraded = onnx.version_converter.convert_version(opset9_cnn(), 11)
    return {
        "classifier": (build_image_classifier(), {"image": rand(2, 3, 32, 32)}),
        "conv-bn-opset11": (upgraded, {"x": rand(1, 3, 8, 8)}),
        "transformer-block": (transformer_block(), {"x": rand(2, 5, 16)}),
    }


@pytest.mark.parametrize("name", ["classifier", "conv-bn-opset11", "transformer-block"])
def test_every_prefix_of_the_pipeline_matches_onnxruntime(tmp_path, name):
    """After each pass in PASSES (applied in order), the graph still computes what the original does."""
    source, feeds = pipeline_models()[name]
    graph = translate(
        onnx.shape_inference.infer_shapes(source, strict_mode=True), source.opset_import[0].version
    )
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for step in optimize.PASSES:
        graph = step(graph)
        path = tmp_path / f"{step.__name__}.ferry"
        write_package(
            path, graph=graph.graph_dict(), tensors=graph.tensors, inputs=graph.inputs, outputs=graph.outputs
        )
        got = Session(path, threads=1).run(feeds)
        for spec, expected in zip(graph.outputs, want, strict=True):
            np.testing.assert_allclose(
                got[spec["name"]], expected, rtol=1e-4, atol=1e-5, err_msg=step.__name__
            )
