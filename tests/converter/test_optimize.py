"""Each optimization pass alone: the pattern it targets is rewritten, and the graph after the pass
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converter import convert, optimize
from converter.translate import translate
from engine import Session
from engine.format import read_package, write_package
from tests.converter.models import fvalue, model

RNG = np.random.default_rng(7)


def const(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check_pass(tmp_path, source: onnx.ModelProto, step, feeds: dict[str, np.ndarray]):
    """Apply one pass to the translated model; compare the engine's result with onnxruntime's."""
    inferred = onnx.shape_inference.infer_shapes(source, strict_mode=True)
    graph = step(optimize.drop_pass_through(translate(inferred, source.opset_import[0].version)))
    path = tmp_path / f"{step.__name__}.ferry"
    write_package(
        path,
        graph=graph.graph_dict(),
        tensors=graph.tensors,
        inputs=graph.inputs,
        outputs=graph.outputs,
    )
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = Session(path, threads=1).run(feeds)
    for spec, expected in zip(graph.outputs, want, strict=True):
        np.testing.assert_allclose(got[spec["name"]], expected, rtol=1e-4, atol=1e-5)
    return graph


def ops(graph) -> list[str]:
    return [node["op"] for node in graph.nodes]


def test_fold_constants(tmp_path):
    m = model(
        [
            helper.make_node("Mul", ["a", "b"], ["ab"]),
            helper.make_node("Transpose", ["ab"], ["abt"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "abt"], ["y"]),
        ],
        [fvalue("x", [2, 3])],
        [fvalue("y", [2, 4])],
        initializers=[const("a", rand(4, 3)), const("b", rand(4, 3))],
    )
    graph = check_pass(tmp_path, m, optimize.fold_constants, {"x": rand(2, 3)})
    assert ops(graph) == ["MatMul"]
    assert graph.tensors["abt"].shape == (3, 4)


def test_shapes_that_are_static_fold_and_symbolic_ones_do_not(tmp_path):
    shape_of = lambda value, out: helper.make_node("Shape", [value], [out])  # noqa: E731
    m = model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            shape_of("r", "static"),  # r is [2, 3, 4]: folds, and so does the Reshape's Concat
            helper.make_node("Slice", ["static", "zero", "two"], ["lead"]),
            helper.make_node("Concat", ["lead", "minus_one"], ["target"], axis=0),
            helper.make_node("Reshape", ["r", "target"], ["y"]),
            shape_of("d", "dynamic"),  # d is [n, 3]: stays
            helper.make_node("Cast", ["dynamic"], ["n"], to=TensorProto.FLOAT),
        ],
        [fvalue("x", [2, 3, 4]), fvalue("d", ["n", 3])],
        [fvalue("y", [2, 3, 4]), fvalue("n", [2])],
        initializers=[
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        ],
    )
    graph = check_pass(tmp_path, m, optimize.fold_constants, {"x": rand(2, 3, 4), "d": rand(5, 3)})
    assert ops(graph) == ["Relu", "Reshape", "Shape", "Cast"]
    assert graph.tensors["target"].tolist() == [2, 3, -1]


def test_fold_constants_never_grows_the_package_much(tmp_path):
    m = model(
        [
            helper.make_node("Expand", ["one", "shape"], ["big"]),
            helper.make_node("Add", ["x", "big"], ["y"]),
        ],
        [fvalue("x", [256, 256])],
        [fvalue("y", [256, 256])],
        initializers=[const("one", [1.0]), numpy_helper.from_array(np.array([256, 256], np.int64), "shape")],
    )
    graph = check_pass(tmp_path, m, optimize.fold_constants, {"x": rand(256, 256)})
    assert ops(graph) == ["Expand", "Add"]


def gelu_model(half_first: bool) -> onnx.ModelProto:
    tail = (
        [
            helper.make_node("Mul", ["x", "half"], ["xh"]),
            helper.make_node("Mul", ["xh", "e1"], ["y"]),
        ]
        if half_first
        else [
            helper.make_node("Mul", ["x", "e1"], ["xe"]),
            helper.make_node("Mul", ["xe", "half"], ["y"]),
        ]
    )
    return model(
        [
            helper.make_node("Div", ["x", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            *tail,
        ],
        [fvalue("x", [2, 8])],
        [fvalue("y", [2, 8])],
        initializers=[const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)],
    )


def test_fuse_gelu_as_pytorch_exports_it(tmp_path):
    graph = check_pass(tmp_path, gelu_model(half_first=False), optimize.fuse_gelu, {"x": rand(2, 8)})
    assert ops(graph) == ["Gelu"]


def test_fuse_gelu_leaves_a_different_pattern_alone(tmp_path):
    graph = check_pass(tmp_path, gelu_model(half_first=True), optimize.fuse_gelu, {"x": rand(2, 8)})
    assert "Erf" in ops(graph)  # x*0.5 first, then * (1+erf): not the pattern it knows, left as is


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
    graph = check_pass(tmp_path, m, optimize.fuse_layer_norm, {"x": rand(2, 5, 16)})
    assert ops(graph) == ["LayerNormalization"]
    assert graph.nodes[0]["attrs"] == {"axis": -1, "epsilon": pytest.approx(1e-5)}


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
    graph = check_pass(tmp_path, m, optimize.fuse_attention, feeds)
    assert ops(graph) == ["FusedAttention"]
    assert graph.nodes[0]["attrs"] == {"scale": 0.125, "k_transposed": 0}
    assert len(graph.nodes[0]["inputs"]) == (4 if masked else 3)


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
    graph = check_pass(tmp_path, m, optimize.fold_batch_norm, {"x": rand(1, 3, 6, 6)})
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
    graph = check_pass(tmp_path, m, optimize.fold_batch_norm, {"x": rand(1, 4, 5, 5)})
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
    graph = optimize.fold_batch_norm(translate(onnx.shape_inference.infer_shapes(m), 17))
    assert ops(graph) == ["Conv", "BatchNormalization"]


@pytest.mark.parametrize(("shape", "fused"), [([4, 8], "Gemm"), ([2, 4, 8], "FusedMatMul")])
def test_fuse_matmul_add(tmp_path, shape, fused):
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        [fvalue("x", shape)],
        [fvalue("y", [*shape[:-1], 5])],
        initializers=[const("w", rand(8, 5)), const("b", rand(5))],
    )
    graph = check_pass(tmp_path, m, optimize.fuse_matmul_add, {"x": rand(*shape)})
    assert ops(graph) == [fused]


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
    graph = check_pass(tmp_path, m, optimize.fuse_activation, {"x": rand(*x_shape) * 4})
    assert ops(graph) == [f"Fused{base}"]
    assert graph.nodes[0]["attrs"]["activation"] == activation


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
    graph = check_pass(tmp_path, m, optimize.simplify_transposes, {"x": rand(2, 3, 4)})
    assert ops(graph) == ["Relu", "Transpose"]


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
    graph = check_pass(tmp_path, m, optimize.simplify_reshapes, {"x": rand(2, 3, 4)})
    assert ops(graph) == ["Reshape"]


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


def test_int_typed_graph_is_left_alone(tmp_path):
    m = model(
        [helper.make_node("Add", ["i", "k"], ["y"])],
        [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [3])],
        initializers=[numpy_helper.from_array(np.array([1, 2, 3], np.int64), "k")],
    )
    graph = check_pass(tmp_path, m, optimize.fold_constants, {"i": np.array([4, 5, 6], np.int64)})
    assert ops(graph) == ["Add"]


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
