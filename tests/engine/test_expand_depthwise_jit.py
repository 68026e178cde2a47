"""The band kernel for a 1x1 expansion and the 3x3 depthwise conv after it
(engine/ops/conv/expand_depthwise_jit.py) against the two kernels it replaces (bit for bit) and
onnx's ReferenceEvaluator, over shapes, strides, pads, batches, activations and band sizes; and
the planner's fusion (engine/fuse_expand.py): where it fuses, where it must not, and a session's
results with and without it.  Skipped as a whole without numba or with FERRY_JIT=0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("numba")

from engine import Session, jit  # noqa: E402
from engine.fuse_expand import fuse_expand  # noqa: E402
from tests.engine.helpers import fused_conv_reference  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

bands = jit.module("engine.ops.conv.expand_depthwise_jit")
from engine.ops.conv import depthwise_vec_jit, gemm_conv_jit  # noqa: E402
from engine.ops.fused import with_activation  # noqa: E402

CLIPS = {None: {}, "Relu": {"activation": "Relu"}}
CLIPS["Clip"] = {"activation": "Clip", "activation_attrs": {"min": 0.0, "max": 6.0}}


def _operands(rng: np.random.Generator, n: int, cin: int, cexp: int, size: tuple[int, int]) -> tuple:
    x = rng.standard_normal((n, cin, *size)).astype(np.float32)
    w_e = (rng.standard_normal((cexp, cin, 1, 1)) * 0.5).astype(np.float32)
    b_e = rng.standard_normal(cexp).astype(np.float32)
    w_d = rng.standard_normal((cexp, 1, 3, 3)).astype(np.float32)
    b_d = rng.standard_normal(cexp).astype(np.float32)
    return x, w_e, b_e, w_d, b_d


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2),
    cin=st.sampled_from([3, 8, 16, 24]),
    cexp=st.sampled_from([16, 48, 96]),
    height=st.integers(1, 19),
    width=st.integers(1, 19),
    stride=st.sampled_from([1, 2]),
    pad=st.sampled_from([0, 1]),
    activations=st.tuples(st.sampled_from(list(CLIPS)), st.sampled_from(list(CLIPS))),
    band_bytes=st.sampled_from([1, 4096, 1 << 20]),
    seed=st.integers(0, 2**16),
)
def test_bands_give_the_two_kernels_results_bit_for_bit(
    n, cin, cexp, height, width, stride, pad, activations, band_bytes, seed
):
    """BAND_BYTES 1 makes every band one output row (every slide of the buffer runs); 1 MB one
    band for the whole image."""
    if height + 2 * pad < 3 or width + 2 * pad < 3:
        return
    x, w_e, b_e, w_d, b_d = _operands(np.random.default_rng(seed), n, cin, cexp, (height, width))
    expand = {"kernel_shape": [1, 1], **CLIPS[activations[0]]}
    depthwise = {"kernel_shape": [3, 3], "group": cexp, "strides": [stride] * 2, "pads": [pad] * 4}
    depthwise.update(CLIPS[activations[1]])
    packed = bands.pack_expansion(w_e)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bands, "BAND_BYTES", band_bytes)
        got = bands.expand_depthwise([x, packed, b_e, w_d, b_d], {"expand": expand, "depthwise": depthwise})[
            0
        ]
    wide = with_activation(gemm_conv_jit.conv_1x1_gemm)([x, packed, b_e], expand)[0]
    apart = with_activation(depthwise_vec_jit.conv_depthwise_jit_vec)([wide, w_d, b_d], depthwise)[0]
    np.testing.assert_array_equal(got, apart)
    first = fused_conv_reference(x, w_e, b_e, None, expand, activations[0])
    want = fused_conv_reference(first, w_d, b_d, None, depthwise, activations[1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_shapes_the_bands_do_not_take_run_the_two_kernels():
    """24 wide channels (not a multiple of the depthwise kernel's 16) and a 5x5 depthwise filter:
    the pair runs apart, with each node's activation."""
    rng = np.random.default_rng(0)
    x, w_e, b_e, w_d, b_d = _operands(rng, 1, 8, 24, (9, 9))
    expand = {"kernel_shape": [1, 1], **CLIPS["Clip"]}
    depthwise = {"kernel_shape": [3, 3], "group": 24, "pads": [1] * 4, **CLIPS["Relu"]}
    got = bands.expand_depthwise([x, w_e, b_e, w_d, b_d], {"expand": expand, "depthwise": depthwise})[0]
    first = fused_conv_reference(x, w_e, b_e, None, expand, "Clip")
    want = fused_conv_reference(first, w_d, b_d, None, depthwise, "Relu")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    w5 = rng.standard_normal((16, 1, 5, 5)).astype(np.float32)
    _, w_e16, b_e16, _, b_d16 = _operands(rng, 1, 8, 16, (9, 9))
    depthwise5 = {"kernel_shape": [5, 5], "group": 16, "pads": [2] * 4}
    got = bands.expand_depthwise([x, w_e16, b_e16, w5, b_d16], {"expand": expand, "depthwise": depthwise5})[0]
    first = fused_conv_reference(x, w_e16, b_e16, None, expand, "Clip")
    want = fused_conv_reference(first, w5, b_d16, None, depthwise5, None)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _block(cin: int, cexp: int, size: int, wide_is_output: bool = False) -> tuple[onnx.ModelProto, dict]:
    """A MobileNetV2 block: 1x1 expansion + Clip, depthwise 3x3 stride 2 + Clip, 1x1 projection."""
    rng = np.random.default_rng(1)
    x, w_e, b_e, w_d, b_d = _operands(rng, 1, cin, cexp, (size, size))
    w_p = (rng.standard_normal((cin, cexp, 1, 1)) * 0.1).astype(np.float32)
    lo, hi = numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")
    nodes = [
        helper.make_node("Conv", ["x", "w_e", "b_e"], ["e"], kernel_shape=[1, 1]),
        helper.make_node("Clip", ["e", "lo", "hi"], ["wide"]),
        helper.make_node(
            "Conv",
            ["wide", "w_d", "b_d"],
            ["d"],
            kernel_shape=[3, 3],
            group=cexp,
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),  # fmt: skip
        helper.make_node("Clip", ["d", "lo", "hi"], ["dc"]),
        helper.make_node("Conv", ["dc", "w_p"], ["y"], kernel_shape=[1, 1]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, cin, size // 2, size // 2))]
    if wide_is_output:
        outputs.append(helper.make_tensor_value_info("wide", TensorProto.FLOAT, (1, cexp, size, size)))
    initializers = [numpy_helper.from_array(v, k) for k, v in {"w_e": w_e, "b_e": b_e, "w_d": w_d,
                    "b_d": b_d, "w_p": w_p}.items()] + [lo, hi]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        outputs,
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": x}


def _planned(path: Path, feeds: dict, fusion: str, monkeypatch) -> tuple[dict, list]:
    from converter import convert  # noqa: PLC0415

    monkeypatch.setenv("FERRY_EXPAND_FUSION", fusion)
    package = path.with_suffix(".ferry")
    if not package.exists():
        convert(path, package)
    session = Session(package, threads=1)
    session.run(feeds)
    return session.run(feeds), [(t.op, t.kernel) for t in session.profile(feeds)]


def test_a_session_fuses_a_wide_block_and_gives_the_unfused_results(tmp_path, monkeypatch):
    """96 channels at 112x112 (4.8 MB between the convs, MobileNetV2's first block): one band step
    where the search chose the JIT kernels; the results of a session without the fusion."""
    model, feeds = _block(16, 96, 112)
    onnx.save(model, tmp_path / "block.onnx")
    fused, steps = _planned(tmp_path / "block.onnx", feeds, "1", monkeypatch)
    apart, steps_apart = _planned(tmp_path / "block.onnx", feeds, "0", monkeypatch)
    kernels = [kernel for _, kernel in steps_apart]
    assert "conv.expand_depthwise" not in kernels
    # the search chose among several kernels for each conv: the pair fuses where it chose the two
    # the band kernel is made of (on this test's hosts it does)
    if kernels[0].endswith(("1x1_gemm", "1x1_gemm8")) and kernels[1].endswith("depthwise_jit_vec"):
        assert steps[0] == ("ExpandDepthwise", "conv.expand_depthwise")
        assert steps[1:] == steps_apart[2:]
    np.testing.assert_array_equal(fused["y"], apart["y"])


def test_small_or_shared_wide_tensors_stay_apart(tmp_path, monkeypatch):
    """Below MIN_WIDE_BYTES (14x14) nothing fuses; a wide tensor that is also a graph output is
    written whole, so its pair stays apart too."""
    for name, (model, feeds) in {
        "small": _block(16, 96, 14),
        "output": _block(16, 96, 112, wide_is_output=True),
    }.items():
        onnx.save(model, tmp_path / f"{name}.onnx")
        _, steps = _planned(tmp_path / f"{name}.onnx", feeds, "1", monkeypatch)
        assert "ExpandDepthwise" not in [op for op, _ in steps], name


def test_plans_shared_with_the_team_are_not_fused():
    steps = [object()]
    assert fuse_expand(steps, None, set(), {}, with_team=True) is steps
