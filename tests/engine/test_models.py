"""Multi-op graphs through convert() + Session vs onnxruntime, including shapes computed at run time."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converter import convert
from engine import Session

D, HEADS = 8, 2


def attention_block(seed: int = 0) -> onnx.ModelProto:
    """Self-attention + MLP over x[batch, seq, D], with the head split done from Shape at run time."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name
        )

    def ints(name: str, *values: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "ln_scale", "ln_bias"], ["h"], axis=-1),
        n("MatMul", ["h", "w_qkv"], ["qkv"]),
        n("Split", ["qkv", "split3"], ["q", "k", "v"], axis=-1),
        n("Shape", ["x"], ["x_shape"]),
        n("Slice", ["x_shape", "zero", "two"], ["batch_seq"]),
        n("Concat", ["batch_seq", "heads_dim"], ["split_shape"], axis=0),
        *[n("Reshape", [t, "split_shape"], [f"{t}4"]) for t in "qkv"],
        n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k4"], ["kh"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qh", "kh"], ["scores"]),
        n("Div", ["scores", "sqrt_d"], ["scaled"]),
        n("Softmax", ["scaled"], ["attn"], axis=-1),
        n("MatMul", ["attn", "vh"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Concat", ["batch_seq", "minus_one"], ["merge_shape"], axis=0),
        n("Reshape", ["ctx_t", "merge_shape"], ["merged"]),
        n("Add", ["x", "merged"], ["res1"]),
        n("MatMul", ["res1", "w_up"], ["up"]),
        n("Gelu", ["up"], ["act"]),
        n("MatMul", ["act", "w_down"], ["down"]),
        n("Add", ["res1", "down"], ["y"]),
        n("ReduceMean", ["y", "axis1"], ["pooled"], keepdims=0),
    ]
    inits = [
        numpy_helper.from_array(np.ones(D, np.float32), "ln_scale"),
        numpy_helper.from_array(np.zeros(D, np.float32), "ln_bias"),
        w("w_qkv", D, 3 * D),
        w("w_up", D, 2 * D),
        w("w_down", 2 * D, D),
        ints("split3", D, D, D),
        ints("zero", 0),
        ints("two", 2),
        ints("heads_dim", HEADS, D // HEADS),
        ints("minus_one", -1),
        ints("axis1", 1),
        numpy_helper.from_array(np.array(np.sqrt(D // HEADS), np.float32), "sqrt_d"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", D])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    model = attention_block()
    path = tmp_path_factory.mktemp("attention") / "attention.ferry"
    convert(model, path)
    return Session(path), ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 5), (3, 7), (2, 5)])
def test_attention_block_matches_onnxruntime_at_every_length(attention, batch, seq):
    session, reference = attention
    x = np.random.default_rng(seq).standard_normal((batch, seq, D)).astype(np.float32)
    want = reference.run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run({"x": x})["pooled"], want, rtol=1e-4, atol=1e-5)


def mobile_block(seed: int = 0) -> onnx.ModelProto:
    """Pointwise expand, depthwise 3x3 stride 2, BatchNorm, ReLU6 (Clip), HardSwish, pool, classifier."""
    rng = np.random.default_rng(seed)

    def t(name: str, array) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(array, np.float32), name)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "expand_w"], ["e"]),
        n("Constant", [], ["six"], value=t("six", 6.0)),
        n("Constant", [], ["nought"], value_float=0.0),
        n("Clip", ["e", "nought", "six"], ["e6"]),
        n("Conv", ["e6", "dw_w", "dw_b"], ["d"], group=12, strides=[2, 2], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["d", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"]),
        n("HardSwish", ["bn"], ["hs"]),
        n("GlobalAveragePool", ["hs"], ["gap"]),
        n("Flatten", ["gap"], ["flat"]),
        n("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    inits = [
        t("expand_w", rng.standard_normal((12, 3, 1, 1)) * 0.5),
        t("dw_w", rng.standard_normal((12, 1, 3, 3)) * 0.3),
        t("dw_b", rng.standard_normal(12) * 0.1),
        t("bn_s", rng.random(12) + 0.5),
        t("bn_b", rng.standard_normal(12) * 0.1),
        t("bn_m", rng.standard_normal(12) * 0.1),
        t("bn_v", rng.random(12) + 0.5),
        t("fc_w", rng.standard_normal((5, 12)) * 0.3),
        t("fc_b", np.zeros(5)),
    ]
    graph = helper.make_graph(
        nodes,
        "mobile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("quantize", "atol"), [(None, 1e-4), ("fp16", 1e-2)])
def test_mobile_block_matches_onnxruntime(tmp_path, quantize, atol):
    model = mobile_block()
    report = convert(model, tmp_path / "m.ferry", quantize=quantize)
    assert (report.nodes_before, report.nodes_after) == (10, 8)  # the two Constants became tensors
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    session = Session(tmp_path / "m.ferry")
    np.testing.assert_allclose(session.run({"x": x})["logits"], want[0], rtol=1e-4, atol=atol)
    kernels = [t.kernel for t in session.profile({"x": x}) if t.op == "Conv"]
    assert kernels == ["conv.conv_1x1", "conv.conv_depthwise"]
