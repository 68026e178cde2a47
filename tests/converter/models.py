"""Small ONNX models for the converter tests, each built to trip one check (or none)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, initializers=(), opset: int = 17, extra_opsets=(), ir_version: int = 8):
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    m = helper.make_model(graph, opset_imports=imports, producer_name="tests")
    m.ir_version = ir_version
    return m


def fvalue(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def two_unsupported_ops() -> onnx.ModelProto:
    """Valid ONNX, but Hardmax and ReduceLogSumExp are not in the engine."""
    return model(
        [
            helper.make_node("Hardmax", ["x"], ["h"], name="hard"),
            helper.make_node("Relu", ["h"], ["r"], name="fine"),
            helper.make_node("ReduceLogSumExp", ["r"], ["y"], name="lse", keepdims=1),
            helper.make_node("Hardmax", ["y"], ["z"]),
        ],
        [fvalue("x", [2, 3])],
        [fvalue("z", [1, 1])],
    )


def custom_domain_op() -> onnx.ModelProto:
    return model(
        [
            helper.make_node("FusedThing", ["x"], ["y"], name="fused", domain="com.acme"),
            helper.make_node("Hardmax", ["y"], ["z"], name="hard"),
        ],
        [fvalue("x", [2, 3])],
        [fvalue("z", [2, 3])],
        extra_opsets=[("com.acme", 1)],
    )


def type_mismatch() -> onnx.ModelProto:
    """Add of float and int64: the checker's type inference rejects it."""
    return model(
        [helper.make_node("Add", ["x", "k"], ["y"])],
        [fvalue("x", [2])],
        [fvalue("y", [2])],
        initializers=[numpy_helper.from_array(np.array([1, 2], np.int64), "k")],
    )


def opset9_cnn(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "scale": (rng.random(4) + 0.5).astype(np.float32),
        "bias": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": (rng.random(4) + 0.5).astype(np.float32),
    }
    return model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
            helper.make_node("Relu", ["bn"], ["r"]),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("Softmax", ["f"], ["y"]),
        ],
        [fvalue("x", [1, 3, 8, 8])],
        [fvalue("y", [1, 64])],
        initializers=[numpy_helper.from_array(v, k) for k, v in weights.items()],
        opset=9,
        ir_version=4,
    )


def constants_identity_and_dead_branch() -> onnx.ModelProto:
    """Unnamed nodes; a Constant, an Identity, a dead Relu: only the Add should survive."""
    return model(
        [
            helper.make_node(
                "Constant", [], ["k"], value=numpy_helper.from_array(np.array([1.5, -2], np.float32))
            ),
            helper.make_node("Identity", ["x"], ["xi"]),
            helper.make_node("Relu", ["x"], ["unused"]),
            helper.make_node("Add", ["xi", "k"], ["y"]),
        ],
        [fvalue("x", ["batch", 2])],
        [fvalue("y", ["batch", 2])],
    )


def masked_fill() -> onnx.ModelProto:
    """ConstantOfShape with a -inf tensor attribute (JSON has no -inf) feeding a Max."""
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [-np.inf])
    return model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["fill"], value=value),
            helper.make_node("Max", ["x", "fill"], ["y"]),
        ],
        [fvalue("x", ["n", 3])],  # a symbolic dim: Shape(x) does not fold to a constant
        [fvalue("y", ["n", 3])],
    )


def gather_out_of_range_on_selftest() -> onnx.ModelProto:
    """Valid, but index 1 is out of range for a 1-row table: the self-test input (0/1 ints) hits it."""
    return model(
        [helper.make_node("Gather", ["table", "idx"], ["y"], name="lookup")],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [8])],
        [fvalue("y", [8, 4])],
        initializers=[numpy_helper.from_array(np.ones((1, 4), np.float32), "table")],
    )
