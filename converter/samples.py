"""Small ONNX models built in code, for the demo and for tests (no files to download)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SAMPLE_OPSET = 17


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def build_image_classifier(
    *, seed: int = 0, num_classes: int = 10, image_size: int = 32, channels: int = 3
) -> onnx.ModelProto:
    """A small CNN: (Conv+Relu+MaxPool), (Conv+Relu), GlobalAveragePool, Flatten, Gemm, Softmax.

    Input "image" float32 [N, channels, image_size, image_size] (symbolic batch "N"),
    output "probabilities" float32 [N, num_classes].  Same seed, same bytes.
    """
    rng = np.random.default_rng(seed)
    c1, c2 = 8, 16
    weights = {
        "conv1.weight": _he(rng, (c1, channels, 3, 3), channels * 9),
        "conv1.bias": (rng.standard_normal(c1) * 0.01).astype(np.float32),
        "conv2.weight": _he(rng, (c2, c1, 3, 3), c1 * 9),
        "conv2.bias": (rng.standard_normal(c2) * 0.01).astype(np.float32),
        "fc.weight": _he(rng, (num_classes, c2), c2),
        "fc.bias": (rng.standard_normal(num_classes) * 0.01).astype(np.float32),
    }
    nodes = [
        helper.make_node(
            "Conv",
            ["image", "conv1.weight", "conv1.bias"],
            ["conv1"],
            name="conv1",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(
            "Conv",
            ["pool1", "conv2.weight", "conv2.bias"],
            ["conv2"],
            name="conv2",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["relu2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["features"], name="flatten", axis=1),
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "ferry_image_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", channels, image_size, image_size])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", num_classes])],
        initializer=[numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", SAMPLE_OPSET)],
        producer_name="ferry.samples",
        producer_version="1",
    )
    model.ir_version = 8  # readable by every onnxruntime that supports opset 17
    onnx.checker.check_model(model, full_check=True)
    return model
