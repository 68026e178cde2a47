"""The fold_constants pass alone: the pattern it targets is rewritten, and the graph after it
computes what onnxruntime computes for the original model on random inputs."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from converter.passes import fold_constants
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import check_pass, const, ops, rand


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
    graph = check_pass(tmp_path, m, fold_constants.run, {"x": rand(2, 3)})
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
    graph = check_pass(tmp_path, m, fold_constants.run, {"x": rand(2, 3, 4), "d": rand(5, 3)})
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
    graph = check_pass(tmp_path, m, fold_constants.run, {"x": rand(256, 256)})
    assert ops(graph) == ["Expand", "Add"]


def test_int_typed_graph_is_left_alone(tmp_path):
    m = model(
        [helper.make_node("Add", ["i", "k"], ["y"])],
        [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [3])],
        initializers=[numpy_helper.from_array(np.array([1, 2, 3], np.int64), "k")],
    )
    graph = check_pass(tmp_path, m, fold_constants.run, {"i": np.array([4, 5, 6], np.int64)})
    assert ops(graph) == ["Add"]
