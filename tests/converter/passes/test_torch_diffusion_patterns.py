"""torch's exported attention (split scale from a dynamic Shape) and GroupNorm (InstanceNorm
based), built with onnx.helper as torch writes them for a diffusers UNet: the converter's passes
fuse them (FusedAttention, GroupNormalization) and the result matches onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converter import optimize
from converter.passes import fold_shape_values, fuse_group_norm, merge_attention_scales
from converter.translate import translate
from engine import Session
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import RNG, const, ops, rand
from tests.model_packages import write_package

HEADS, WIDTH, CONTEXT = 2, 16, 12


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _heads(prefix: str, source: str, perm: list[int]) -> list[onnx.NodeProto]:
    """Reshape(source, [B, -1, heads, width / heads]) -> Transpose(perm), the head width computed
    from Shape(source) as torch does (Gather, Div, Cast, Cast, Unsqueeze, Concat)."""
    p = prefix
    return [
        helper.make_node("Shape", ["x"], [f"{p}_xs"]),
        helper.make_node("Gather", [f"{p}_xs", "zero"], [f"{p}_b"], axis=0),
        helper.make_node("Unsqueeze", [f"{p}_b", "axis0"], [f"{p}_bu"]),
        helper.make_node("Shape", [source], [f"{p}_ks"]),
        helper.make_node("Gather", [f"{p}_ks", "two"], [f"{p}_w"], axis=0),
        helper.make_node("Div", [f"{p}_w", "heads"], [f"{p}_d"]),
        helper.make_node("Cast", [f"{p}_d"], [f"{p}_dc"], to=TensorProto.INT64),
        helper.make_node("Cast", [f"{p}_dc"], [f"{p}_dc2"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", [f"{p}_dc2", "axis0"], [f"{p}_du"]),
        helper.make_node("Concat", [f"{p}_bu", "minus1", "heads1", f"{p}_du"], [f"{p}_target"], axis=0),
        helper.make_node("Reshape", [source, f"{p}_target"], [f"{p}_split"]),
        helper.make_node("Transpose", [f"{p}_split"], [f"{p}_h"], perm=perm),
    ]


def torch_attention(masked: bool = False) -> onnx.ModelProto:
    """Cross-attention as torch exports diffusers' Attention (opset 17, dynamic batch and length);
    ``masked``: with an additive mask between the product and the Softmax, as CLIP's text encoder
    adds its causal mask."""
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["ctx", "wk"], ["k"]),
        helper.make_node("MatMul", ["ctx", "wv"], ["v"]),
        *_heads("q", "q", [0, 2, 1, 3]),
        *_heads("k", "k", [0, 2, 3, 1]),
        *_heads("v", "v", [0, 2, 1, 3]),
        # s = sqrt(1 / sqrt(d)) from the last dim of q's heads, applied to q and to kT
        helper.make_node("Shape", ["q_h"], ["qs"]),
        helper.make_node("Slice", ["qs", "minus1", "big"], ["d"]),
        helper.make_node("Cast", ["d"], ["df"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["df"], ["sqrt_d"]),
        helper.make_node("Div", ["one", "sqrt_d"], ["inv"]),
        helper.make_node("Cast", ["inv"], ["inv_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["inv_f"], ["s"]),
        helper.make_node("Mul", ["q_h", "s"], ["qs_scaled"]),
        helper.make_node("Sqrt", ["inv_f"], ["s2"]),
        helper.make_node("Mul", ["k_h", "s2"], ["kt_scaled"]),
        helper.make_node("MatMul", ["qs_scaled", "kt_scaled"], ["scores"]),
        *([helper.make_node("Add", ["scores", "mask"], ["masked"])] if masked else []),
        helper.make_node("Softmax", ["masked" if masked else "scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_h"], ["heads_out"]),
        helper.make_node("Transpose", ["heads_out"], ["merged"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["merged", "out_shape"], ["y"]),
    ]
    initializers = [
        const("wq", RNG.standard_normal((WIDTH, WIDTH)) * 0.5),
        const("wk", RNG.standard_normal((CONTEXT, WIDTH)) * 0.5),
        const("wv", RNG.standard_normal((CONTEXT, WIDTH)) * 0.5),
        ints("zero", 0), ints("two", 2), ints("heads", HEADS), ints("axis0", [0]),
        ints("minus1", [-1]), ints("heads1", [HEADS]), ints("big", [2**63 - 1]),
        const("one", [1.0]), ints("out_shape", [0, -1, WIDTH]),
    ]  # fmt: skip
    inputs = [fvalue("x", ["batch", "seq", WIDTH]), fvalue("ctx", ["batch", "tokens", CONTEXT])]
    if masked:
        inputs.append(fvalue("mask", ["seq", "tokens"]))
    return model(nodes, inputs, [fvalue("y", ["batch", "seq", WIDTH])], initializers)


def torch_group_norm(groups: int, channels: int, silu: bool) -> onnx.ModelProto:
    """nn.GroupNorm as torch exports it before opset 18, optionally followed by SiLU."""
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["grouped"]),
        helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normed"], epsilon=1e-6),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Reshape", ["normed", "x_shape"], ["back"]),
        helper.make_node("Mul", ["back", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["y" if not silu else "gn"]),
    ]
    if silu:
        nodes += [
            helper.make_node("Sigmoid", ["gn"], ["gate"]),
            helper.make_node("Mul", ["gn", "gate"], ["y"]),
        ]
    initializers = [
        ints("split", [0, groups, -1]), const("ones", np.ones(groups)), const("zeros", np.zeros(groups)),
        const("gamma", 1 + RNG.standard_normal((channels, 1, 1))),
        const("beta", RNG.standard_normal((channels, 1, 1))),
    ]  # fmt: skip
    shape = ["batch", channels, "height", "width"]
    return model(nodes, [fvalue("x", shape)], [fvalue("y", shape)], initializers)


def converted(tmp_path, source: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """Every converter pass (shapes inferred as the converter does); compared with onnxruntime."""
    inferred = onnx.shape_inference.infer_shapes(source, strict_mode=True, data_prop=True)
    graph, _ = optimize.optimize(translate(inferred, source.opset_import[0].version))
    path = tmp_path / "model.ferry"
    write_package(
        path, graph=graph.graph_dict(), tensors=graph.tensors, inputs=graph.inputs, outputs=graph.outputs
    )
    session = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = Session(path, threads=1).run(feeds)
    for spec, expected in zip(graph.outputs, want, strict=True):
        np.testing.assert_allclose(got[spec["name"]], expected, rtol=1e-4, atol=1e-4)
    return graph


@pytest.mark.parametrize(("batch", "seq", "tokens"), [(2, 9, 5), (1, 4, 7)])
def test_torch_attention_fuses(tmp_path, batch, seq, tokens):
    feeds = {"x": rand(batch, seq, WIDTH), "ctx": rand(batch, tokens, CONTEXT)}
    graph = converted(tmp_path, torch_attention(), feeds)
    assert "FusedAttention" in ops(graph)
    assert "Softmax" not in ops(graph) and "Sqrt" not in ops(graph)
    fused = next(node for node in graph.nodes if node["op"] == "FusedAttention")
    assert fused["attrs"]["scale"] == pytest.approx((WIDTH // HEADS) ** -0.5, rel=1e-6)


def test_torch_attention_with_an_additive_causal_mask_fuses(tmp_path):
    """CLIP's text encoder: split scales, then Add(scores, causal mask) before the Softmax."""
    seq = tokens = 6
    causal = np.where(np.tril(np.ones((seq, tokens))) > 0, 0.0, -1e4).astype(np.float32)
    feeds = {"x": rand(2, seq, WIDTH), "ctx": rand(2, tokens, CONTEXT), "mask": causal}
    graph = converted(tmp_path, torch_attention(masked=True), feeds)
    assert "Softmax" not in ops(graph) and "Sqrt" not in ops(graph)
    fused = next(node for node in graph.nodes if node["op"] == "FusedAttention")
    assert fused["inputs"][3] == "mask"
    assert fused["attrs"]["scale"] == pytest.approx((WIDTH // HEADS) ** -0.5, rel=1e-6)


def test_fold_shape_values_reads_dims_through_reshape_and_transpose():
    source = torch_attention()
    inferred = onnx.shape_inference.infer_shapes(source, strict_mode=True, data_prop=True)
    graph = fold_shape_values.run(translate(inferred, 17))
    assert "Sqrt" not in ops(graph) and "Cast" not in ops(graph)
    assert float(graph.tensors["s"].reshape(-1)[0]) == pytest.approx((WIDTH // HEADS) ** -0.25)
    # the batch dim stays dynamic: its Shape/Gather are still computed at run time
    assert "Shape" in ops(graph)
    merged = merge_attention_scales.run(graph)
    assert ops(merged).count("Mul") == 1 and "MatMul" in ops(merged)


def test_merge_leaves_a_scaled_product_not_feeding_softmax():
    nodes = [
        helper.make_node("Mul", ["a", "s"], ["as"]),
        helper.make_node("Mul", ["b", "s"], ["bs"]),
        helper.make_node("MatMul", ["as", "bs"], ["y"]),
    ]
    source = model(
        nodes, [fvalue("a", [2, 3]), fvalue("b", [3, 4])], [fvalue("y", [2, 4])], [const("s", [0.5])]
    )
    graph = merge_attention_scales.run(translate(onnx.shape_inference.infer_shapes(source), 17))
    assert ops(graph) == ["Mul", "Mul", "MatMul"]


@pytest.mark.parametrize(("groups", "channels", "silu"), [(4, 8, False), (2, 6, True), (8, 8, False)])
def test_torch_group_norm_fuses(tmp_path, groups, channels, silu):
    feeds = {"x": rand(2, channels, 5, 3) * 3 + 1}
    graph = converted(tmp_path, torch_group_norm(groups, channels, silu), feeds)
    assert ops(graph)[0] == ("FusedGroupNorm" if silu else "GroupNormalization")  # SiLU fused in
    assert "InstanceNormalization" not in ops(graph) and "Reshape" not in ops(graph)
    silu_attr = {"activation": "Silu"} if silu else {}
    assert graph.nodes[0]["attrs"] == {"num_groups": groups, "epsilon": pytest.approx(1e-6), **silu_attr}


def test_group_norm_with_a_non_unit_instance_scale_is_left():
    source = torch_group_norm(4, 8, silu=False)
    for init in source.graph.initializer:
        if init.name == "ones":
            init.CopyFrom(const("ones", np.full(4, 2.0)))
    graph = fuse_group_norm.run(translate(onnx.shape_inference.infer_shapes(source, data_prop=True), 17))
    assert "GroupNormalization" not in ops(graph)


def test_fold_shape_values_through_a_concat_of_two_unknown_dims(tmp_path):
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Slice", ["xs", "zero1", "one1"], ["b"]),
        helper.make_node("Slice", ["xs", "one1", "two1"], ["n"]),
        helper.make_node("Concat", ["b", "n", "heads1", "width1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["split"]),
        helper.make_node("Shape", ["split"], ["ss"]),
        helper.make_node("Gather", ["ss", "three"], ["d"], axis=0),
        helper.make_node("Cast", ["d"], ["df"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["df"], ["root"]),
        helper.make_node("Mul", ["split", "root"], ["y"]),
    ]
    initializers = [
        ints("zero1", [0]), ints("one1", [1]), ints("two1", [2]), ints("three", 3),
        ints("heads1", [HEADS]), ints("width1", [WIDTH // HEADS]),
    ]  # fmt: skip
    source = model(
        nodes,
        [fvalue("x", ["batch", "seq", WIDTH])],
        [fvalue("y", ["batch", "seq", HEADS, WIDTH // HEADS])],
        initializers,
    )
    graph = converted(tmp_path, source, {"x": rand(3, 5, WIDTH)})
    assert "Sqrt" not in ops(graph) and "Gather" not in ops(graph)
