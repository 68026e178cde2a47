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
    assert (report.nodes_before, report.nodes_after) in ((10, 8), (10, 5))  # Constants gone, maybe fused
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    session = Session(tmp_path / "m.ferry", threads=1)  # one whole run: more threads run the batch in parts
    np.testing.assert_allclose(session.run({"x": x})["logits"], want[0], rtol=1e-4, atol=atol)
    kernels = [t.kernel for t in session.profile({"x": x}) if t.op in ("Conv", "FusedConv")]
    assert len(kernels) == 2
    assert "conv_1x1" in kernels[0]
    assert "depthwise" in kernels[1]


def _init(rng: np.random.Generator, name: str, *shape: int, scale: float | None = None) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    value = rng.standard_normal(shape) * (scale if scale is not None else 1 / np.sqrt(fan_in))
    return numpy_helper.from_array(value.astype(np.float32), name)


def resnet_block(seed: int = 0) -> onnx.ModelProto:
    """ResNet18 in small: 7x7/2 stem, BatchNorm, ReLU, max pool, a basic block with 3x3 convs
    (Winograd candidates) and a strided 1x1 shortcut, global pool, classifier."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "stem_w"], ["s"], strides=[2, 2], pads=[3, 3, 3, 3]),
        n("BatchNormalization", ["s", "bn_s", "bn_b", "bn_m", "bn_v"], ["sb"]),
        n("Relu", ["sb"], ["sr"]),
        n("MaxPool", ["sr"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["p", "c1_w", "c1_b"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "c2_w", "c2_b"], ["c2"], pads=[1, 1, 1, 1]),
        n("Conv", ["p", "down_w"], ["down"], strides=[2, 2]),
        n("Add", ["c2", "down"], ["sum"]),
        n("Relu", ["sum"], ["r2"]),
        n("Conv", ["r2", "c3_w", "c3_b"], ["c3"], pads=[1, 1, 1, 1]),
        n("Relu", ["c3"], ["r3"]),
        n("GlobalAveragePool", ["r3"], ["gap"]),
        n("Flatten", ["gap"], ["flat"]),
        n("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    inits = [
        _init(rng, "stem_w", 8, 3, 7, 7),
        numpy_helper.from_array((rng.random(8) + 0.5).astype(np.float32), "bn_s"),
        _init(rng, "bn_b", 8, scale=0.1),
        _init(rng, "bn_m", 8, scale=0.1),
        numpy_helper.from_array((rng.random(8) + 0.5).astype(np.float32), "bn_v"),
        _init(rng, "c1_w", 16, 8, 3, 3),
        _init(rng, "c1_b", 16, scale=0.1),
        _init(rng, "c2_w", 16, 16, 3, 3),
        _init(rng, "c2_b", 16, scale=0.1),
        _init(rng, "down_w", 16, 8, 1, 1),
        _init(rng, "c3_w", 16, 16, 3, 3),
        _init(rng, "c3_b", 16, scale=0.1),
        _init(rng, "fc_w", 10, 16),
        _init(rng, "fc_b", 10, scale=0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "resnet_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 48, 48])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_resnet_block_matches_onnxruntime_planned_and_searched(tmp_path):
    model = resnet_block()
    convert(model, tmp_path / "r.ferry")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = Session(tmp_path / "r.ferry", threads=1)
    rng = np.random.default_rng(5)
    for batch in (1, 1, 1, 2, 2, 2):  # record, plan (kernel search), planned; per signature
        x = rng.standard_normal((batch, 3, 48, 48)).astype(np.float32)
        want = reference.run(None, {"x": x})[0]
        np.testing.assert_allclose(session.run({"x": x})["logits"], want, rtol=1e-4, atol=1e-4)
    convs = [t for t in session.profile({"x": x}) if "Conv" in t.op]
    assert any(t.note.startswith("searched") for t in convs)  # the 3x3 convs had candidates


def segmentation_block(seed: int = 0) -> onnx.ModelProto:
    """An encoder-decoder in small, as torch exports one: a strided conv down, a transposed conv
    (k4 s2 p1) and a 2x bilinear Resize (scales input, half_pixel) back up, per-pixel class
    scores, and each image's three best classes by mean score (TopK)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "down_w", "down_b"], ["d"], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Relu", ["d"], ["dr"]),
        n("ConvTranspose", ["dr", "up_w", "up_b"], ["u"], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Relu", ["u"], ["ur"]),
        n("Resize", ["ur", "", "scales"], ["big"], mode="linear"),
        n("Conv", ["big", "head_w", "head_b"], ["scores"]),
        n("ReduceMean", ["scores"], ["mean"], axes=[2, 3], keepdims=0),
        n("TopK", ["mean", "k"], ["best", "best_class"]),
    ]
    inits = [
        _init(rng, "down_w", 8, 3, 3, 3),
        _init(rng, "down_b", 8, scale=0.1),
        _init(rng, "up_w", 8, 6, 4, 4),
        _init(rng, "up_b", 6, scale=0.1),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        _init(rng, "head_w", 5, 6, 1, 1),
        _init(rng, "head_b", 5, scale=0.1),
        numpy_helper.from_array(np.array([3], np.int64), "k"),
    ]
    outputs = [
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 5, None, None]),
        helper.make_tensor_value_info("best", TensorProto.FLOAT, ["n", 3]),
        helper.make_tensor_value_info("best_class", TensorProto.INT64, ["n", 3]),
    ]
    graph = helper.make_graph(
        nodes,
        "segmentation_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        outputs,
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("quantize", "atol"), [(None, 1e-4), ("fp16", 1e-2)])
def test_segmentation_block_matches_onnxruntime_at_several_sizes(tmp_path, quantize, atol):
    model = segmentation_block()
    convert(model, tmp_path / "s.ferry", quantize=quantize)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = Session(tmp_path / "s.ferry", threads=1)
    rng = np.random.default_rng(3)
    for batch, height, width in [(1, 16, 16), (1, 16, 16), (2, 12, 20), (2, 12, 20), (2, 12, 20)]:
        x = rng.standard_normal((batch, 3, height, width)).astype(np.float32)
        scores, best, best_class = reference.run(None, {"x": x})
        got = session.run({"x": x})
        assert got["scores"].shape == (batch, 5, 2 * height, 2 * width)
        np.testing.assert_allclose(got["scores"], scores, rtol=1e-4, atol=atol)
        np.testing.assert_allclose(got["best"], best, rtol=1e-4, atol=atol)
        if quantize is None:  # fp16 weights may swap two near-equal classes
            np.testing.assert_array_equal(got["best_class"], best_class)


GPT_D, GPT_HEADS, GPT_VOCAB = 16, 2, 50


def gpt_step(seed: int = 0) -> onnx.ModelProto:
    """A one-layer GPT decode step as torch exports it: token + position embedding, LayerNorm,
    attention over [past keys/values, new ones] (concat = the present cache, an output), GELU
    spelled Div/Erf/Add/Mul/Mul, residuals, LM head.  Position comes from the cache's length."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    hd = GPT_D // GPT_HEADS

    def ints(name: str, *values: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [
        n("Gather", ["tok_emb", "ids"], ["te"]),  # [1, 1, D]
        n("Shape", ["past_k"], ["pk_shape"]),
        n("Gather", ["pk_shape", "two"], ["past_len"], axis=0),  # scalar: the new token's position
        n("Gather", ["pos_emb", "past_len"], ["pe"]),  # [D]
        n("Add", ["te", "pe"], ["h"]),
        n("LayerNormalization", ["h", "ln_s", "ln_b"], ["hn"], axis=-1),
        n("MatMul", ["hn", "w_qkv"], ["qkv"]),
        n("Reshape", ["qkv", "qkv_shape"], ["qkv5"]),  # [1, 1, 3, H, hd]
        n("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4]),  # [3, 1, H, 1, hd]
        n("Gather", ["qkvt", "zero"], ["q"], axis=0),
        n("Gather", ["qkvt", "one"], ["k"], axis=0),
        n("Gather", ["qkvt", "two"], ["v"], axis=0),
        n("Concat", ["past_k", "k"], ["present_k"], axis=2),
        n("Concat", ["past_v", "v"], ["present_v"], axis=2),
        n("Transpose", ["present_k"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["scores"]),
        n("Mul", ["scores", "scale"], ["scaled"]),
        n("Softmax", ["scaled"], ["attn"], axis=-1),
        n("MatMul", ["attn", "present_v"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctxt", "merge_shape"], ["merged"]),
        n("MatMul", ["merged", "w_o"], ["o"]),
        n("Add", ["h", "o"], ["h2"]),
        n("MatMul", ["h2", "w_up"], ["up"]),
        n("Div", ["up", "sqrt2"], ["upd"]),
        n("Erf", ["upd"], ["erf"]),
        n("Add", ["erf", "onef"], ["erf1"]),
        n("Mul", ["up", "erf1"], ["g"]),
        n("Mul", ["g", "half"], ["gelu"]),
        n("MatMul", ["gelu", "w_down"], ["down"]),
        n("Add", ["h2", "down"], ["h3"]),
        n("MatMul", ["h3", "w_head"], ["logits"]),
    ]
    f = np.float32
    inits = [
        _init(rng, "tok_emb", GPT_VOCAB, GPT_D, scale=1.0),
        _init(rng, "pos_emb", 64, GPT_D, scale=1.0),
        numpy_helper.from_array(np.ones(GPT_D, f), "ln_s"),
        numpy_helper.from_array(np.zeros(GPT_D, f), "ln_b"),
        _init(rng, "w_qkv", GPT_D, 3 * GPT_D, scale=GPT_D**-0.5),
        _init(rng, "w_o", GPT_D, GPT_D, scale=GPT_D**-0.5),
        _init(rng, "w_up", GPT_D, 4 * GPT_D, scale=GPT_D**-0.5),
        _init(rng, "w_down", 4 * GPT_D, GPT_D, scale=(4 * GPT_D) ** -0.5),
        _init(rng, "w_head", GPT_D, GPT_VOCAB, scale=GPT_D**-0.5),
        ints("qkv_shape", 1, 1, 3, GPT_HEADS, hd),
        ints("merge_shape", 1, 1, GPT_D),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
        numpy_helper.from_array(np.array(hd**-0.5, f), "scale"),
        numpy_helper.from_array(np.array(np.sqrt(2), f), "sqrt2"),
        numpy_helper.from_array(np.array(1, f), "onef"),
        numpy_helper.from_array(np.array(0.5, f), "half"),
    ]
    cache = [1, GPT_HEADS, "past", hd]
    graph = helper.make_graph(
        nodes,
        "gpt_step",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 1]),
            helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, GPT_VOCAB]),
            helper.make_tensor_value_info("present_k", TensorProto.FLOAT, [1, GPT_HEADS, "total", hd]),
            helper.make_tensor_value_info("present_v", TensorProto.FLOAT, [1, GPT_HEADS, "total", hd]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_gpt_decode_loop_matches_onnxruntime_with_a_growing_cache(tmp_path):
    """Greedy decoding, feeding each step's present cache back: every step is a new shape
    signature (a new plan, its position folded from the cache's shape), and a repeated cache
    length re-uses its plan; the outputs must match onnxruntime all along."""
    model = gpt_step()
    convert(model, tmp_path / "g.ferry")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = Session(tmp_path / "g.ferry", threads=1)
    rng = np.random.default_rng(6)
    hd = GPT_D // GPT_HEADS
    start = {
        "ids": np.array([[3]], np.int64),
        "past_k": rng.standard_normal((1, GPT_HEADS, 4, hd)).astype(np.float32),
        "past_v": rng.standard_normal((1, GPT_HEADS, 4, hd)).astype(np.float32),
    }
    for _ in range(2):  # the same loop twice: the second pass runs planned steps only
        feeds = dict(start)
        for _ in range(5):
            want = reference.run(None, feeds)
            got = session.run(feeds)
            for name, expected in zip(("logits", "present_k", "present_v"), want, strict=True):
                np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)
            next_id = int(np.argmax(got["logits"]))
            feeds = {
                "ids": np.array([[next_id]], np.int64),
                "past_k": got["present_k"],
                "past_v": got["present_v"],
            }
    np.testing.assert_array_equal(start["past_k"], feeds["past_k"][:, :, :4])  # feeds never written
