"""A small CNN trained here, with numpy, on scikit-learn's bundled digits (no download):
quantizing it must not cost accuracy that matters (int8 within 0.5 point of float32, int4 within 2)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from converter import convert
from engine import Session

FILTERS, EPOCHS, BATCH, LEARNING_RATE = 16, 30, 64, 0.01


def im2col(images: np.ndarray) -> np.ndarray:
    """[N, 8, 8] -> [N, 64, 9]: each pixel's 3x3 neighbourhood (zero padded), taps in (dy, dx) order."""
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
    taps = [padded[:, dy : dy + 8, dx : dx + 8] for dy in range(3) for dx in range(3)]
    return np.stack(taps, axis=-1).reshape(len(images), 64, 9)


def forward(params: dict[str, np.ndarray], cols: np.ndarray):
    z = cols @ params["conv.w"].T + params["conv.b"]  # [N, 64, F]
    a = np.maximum(z, 0)
    blocks = a.reshape(-1, 4, 2, 4, 2, FILTERS)
    pooled = blocks.max(axis=(2, 4))  # [N, 4, 4, F]
    features = pooled.transpose(0, 3, 1, 2).reshape(len(cols), -1)  # ONNX's Flatten order: C, H, W
    logits = features @ params["fc.w"].T + params["fc.b"]
    return z, blocks, pooled, features, logits


def gradients(params, cols, labels):
    z, blocks, pooled, features, logits = forward(params, cols)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(labels)), labels] -= 1
    g = p / len(labels)
    d_features = g @ params["fc.w"]
    d_pooled = d_features.reshape(-1, FILTERS, 4, 4).transpose(0, 2, 3, 1)
    mask = blocks == pooled[:, :, None, :, None, :]
    d_a = (mask * d_pooled[:, :, None, :, None, :]).reshape(-1, 64, FILTERS)
    d_z = d_a * (z > 0)
    return {
        "fc.w": g.T @ features,
        "fc.b": g.sum(axis=0),
        "conv.w": np.einsum("npf,npk->fk", d_z, cols),
        "conv.b": d_z.sum(axis=(0, 1)),
    }


def train(images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Adam on mini-batches; seeded, so the model (and the test) is the same every run."""
    rng = np.random.default_rng(0)
    params = {
        "conv.w": rng.standard_normal((FILTERS, 9)) * np.sqrt(2 / 9),
        "conv.b": np.zeros(FILTERS),
        "fc.w": rng.standard_normal((10, FILTERS * 16)) * np.sqrt(1 / (FILTERS * 16)),
        "fc.b": np.zeros(10),
    }
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    cols = im2col(images)
    step = 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(images))
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            step += 1
            for name, grad in gradients(params, cols[batch], labels[batch]).items():
                m, v = moments[name]
                m[:] = 0.9 * m + 0.1 * grad
                v[:] = 0.999 * v + 0.001 * grad**2
                m_hat, v_hat = m / (1 - 0.9**step), v / (1 - 0.999**step)
                params[name] -= LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-8)
    return params


def export(params: dict[str, np.ndarray]) -> onnx.ModelProto:
    weights = {
        "conv.w": params["conv.w"].reshape(FILTERS, 1, 3, 3),
        "conv.b": params["conv.b"],
        "fc.w": params["fc.w"],
        "fc.b": params["fc.b"],
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["image", "conv.w", "conv.b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
            helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        ],
        "digits_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests.digits"
    )
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)
    order = np.random.default_rng(1).permutation(len(images))
    train_idx, test_idx = order[:1300], order[1300:]
    params = train(images[train_idx], data.target[train_idx])
    return export(params), images[test_idx][:, None], data.target[test_idx], images[train_idx][:200, None]


def accuracy(package, images, labels) -> float:
    logits = Session(package).run({"image": images})["logits"]
    return float((logits.argmax(axis=1) == labels).mean())


@pytest.mark.slow
def test_quantized_digits_cnn_keeps_its_accuracy(digits, tmp_path):
    model, images, labels, calibration = digits
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ort_accuracy = float((reference.run(None, {"image": images})[0].argmax(axis=1) == labels).mean())

    results = {}
    for mode in (None, "int8", "int4", "int8+activations"):
        dst = tmp_path / f"{mode}.ferry"
        weights, activations = (mode.split("+")[0], "percentile") if mode and "+" in mode else (mode, None)
        report = convert(
            model, dst, quantize=weights, calibration={"image": calibration}, activations=activations
        )
        results[mode] = (accuracy(dst, images, labels), report)
    fp32 = results[None][0]
    assert fp32 > 0.9, "the trained CNN itself should be good"
    assert fp32 == pytest.approx(ort_accuracy, abs=1 / len(labels))
    assert results["int8"][0] >= fp32 - 0.005
    assert results["int4"][0] >= fp32 - 0.02
    # static int8 activations too (ranges from the calibration images): no target, but within a point
    assert results["int8+activations"][0] >= fp32 - 0.01
    assert sorted(results["int8+activations"][1].activation_ranges) == ["f", "image"]
    for mode in ("int8", "int4"):
        report = results[mode][1]
        assert report.quantized_weights == ["conv.w", "fc.w"]
        figures = report.accuracy["outputs"]["logits"]
        assert report.accuracy["inputs"] == "calibration" and figures["top1_agreement"] >= 0.95
