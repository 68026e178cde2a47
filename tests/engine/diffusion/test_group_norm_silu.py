"""GroupNorm + SiLU fused (converter/passes/fuse_group_norm_silu.py -> FusedGroupNorm,
engine/ops/group_norm.py and its JIT twin group_norm_jit.py) against onnxruntime on the
unfused graph, with the numpy kernels and with the JIT ones, at 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from converter import convert
from converter.passes import fuse_group_norm_silu
from converter.translate import translate
from engine import Session
from engine import jit as jit_tier
from engine.ops.group_norm import fused_group_norm, group_normalization
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import const, ops

RNG = np.random.default_rng(21)


def norm_then_silu(channels: int, groups: int, extra_reader: bool = False) -> onnx.ModelProto:
    """GroupNormalization (opset 21) -> Sigmoid, Mul: a ResNet block's norm and SiLU; with
    ``extra_reader`` the norm's output also feeds an Add (the fusion must leave it)."""
    nodes = [
        helper.make_node(
            "GroupNormalization", ["x", "scale", "bias"], ["gn"], num_groups=groups, epsilon=1e-5
        ),
        helper.make_node("Sigmoid", ["gn"], ["gate"]),
        helper.make_node("Mul", ["gate", "gn"], ["act"]),
        helper.make_node("Conv", ["act", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    outputs = [fvalue("y", ["n", channels, "h", "w"])]
    if extra_reader:
        nodes.append(helper.make_node("Add", ["gn", "x"], ["skip"]))
        outputs.append(fvalue("skip", ["n", channels, "h", "w"]))
    initializers = [
        const("scale", 1 + 0.3 * RNG.standard_normal(channels)),
        const("bias", RNG.standard_normal(channels)),
        const("w", 0.2 * RNG.standard_normal((channels, channels, 3, 3))),
    ]
    return model(
        nodes, [fvalue("x", ["n", channels, "h", "w"])], outputs, initializers, opset=21, ir_version=10
    )


def converted_graph(source: onnx.ModelProto):
    return fuse_group_norm_silu.run(translate(onnx.shape_inference.infer_shapes(source), 21))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "groups"), [((2, 8, 6, 5), 4), ((1, 32, 16, 16), 32), ((2, 6, 3, 3), 2)])
def test_fused_group_norm_silu_matches_onnxruntime(tmp_path, jit, threads, shape, groups):
    if jit and not jit_tier.enabled():
        pytest.skip("numba is not installed (or FERRY_JIT=0)")
    source = norm_then_silu(shape[1], groups)
    x = (RNG.standard_normal(shape) * 4 + 2).astype(np.float32)
    report = convert(source, tmp_path / "m.ferry", selftest_inputs={"x": x})
    assert report.nodes_after < report.nodes_before
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    session = Session(tmp_path / "m.ferry", threads=threads, jit=jit)
    for _ in range(3):  # recorded, planned, then the plan's run
        np.testing.assert_allclose(session.run({"x": x})["y"], want[0], rtol=1e-4, atol=1e-4)


def test_the_pass_fuses_only_a_norm_whose_output_feeds_nothing_else():
    fused = converted_graph(norm_then_silu(8, 4))
    assert ops(fused) == ["FusedGroupNorm", "Conv"]
    node = fused.nodes[0]
    assert node["attrs"]["activation"] == "Silu" and node["attrs"]["num_groups"] == 4
    assert node["outputs"] == ["act"]
    left = converted_graph(norm_then_silu(8, 4, extra_reader=True))
    assert ops(left) == ["GroupNormalization", "Sigmoid", "Mul", "Conv", "Add"]


def test_silu_of_extreme_values_and_the_jit_twin_agree_with_numpy():
    if not jit_tier.enabled():
        pytest.skip("numba is not installed (or FERRY_JIT=0)")
    group_norm_jit = jit_tier.module("engine.ops.group_norm_jit")
    x = RNG.standard_normal((2, 12, 7, 9)).astype(np.float32)
    x[0, :3] *= 1e4  # one group far from zero: SiLU's e^-y overflows and must give -0, not NaN
    scale, bias = const("s", 1 + RNG.standard_normal(12)), const("b", RNG.standard_normal(12))
    inputs = [x, onnx.numpy_helper.to_array(scale), onnx.numpy_helper.to_array(bias)]
    attrs = {"num_groups": 3, "epsilon": 1e-5, "activation": "Silu"}
    want = fused_group_norm(inputs, attrs)[0]
    y = group_normalization(inputs, attrs)[0].astype(np.float64)
    np.testing.assert_allclose(want, y / (1 + np.exp(-y)), rtol=1e-5, atol=1e-5)
    got = group_norm_jit.fused_group_norm_jit(inputs, attrs)[0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    plain = group_norm_jit.group_norm_jit(inputs, {"num_groups": 3, "epsilon": 1e-5})[0]
    np.testing.assert_allclose(plain, group_normalization(inputs, attrs)[0], rtol=1e-5, atol=1e-5)
