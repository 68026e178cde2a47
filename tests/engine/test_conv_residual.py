"""FusedConv with a residual (input 3: activation(conv(X) + B + residual), a skip connection) and
the channels-last results of the conv kernels: every kernel the search may pick, on random
shapes, strides, groups (depthwise too), activations and input layouts, against the ONNX
reference; the converter's fusion on small ONNX models against onnxruntime; and the planner
keeping the residual alive until the conv has read it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter import convert, optimize
from converter.translate import translate
from engine import Session
from engine.format import read_package
from engine.kernels import NUMPY as CANDIDATES
from engine.ops import conv, fused
from engine.search import with_packed
from tests.engine.helpers import run_reference
from tests.engine.test_conv_kernels import ACTIVATIONS, assert_own_result, with_activation

SETTINGS = settings(max_examples=40, deadline=None)
RESIDUAL_ACTIVATIONS = [None, "Relu", "Clip", "LeakyRelu"]  # of test_conv_kernels' ACTIVATIONS


def _reference_model(inputs: list, attrs: dict, activation: str | None) -> tuple[onnx.ModelProto, dict]:
    """Conv -> Add(residual) -> activation, the ops the converter fuses, for the reference."""
    names = ["x", "w", "b"] if inputs[2] is not None else ["x", "w"]
    feeds = dict(zip(names, [a for a in inputs[:3] if a is not None], strict=True)) | {"r": inputs[3]}
    onnx_attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    nodes = [helper.make_node("Conv", names, ["c"], **onnx_attrs), helper.make_node("Add", ["c", "r"], ["y"])]
    extra = ACTIVATIONS[activation].get("activation_attrs", {})
    if activation == "Clip":
        nodes.append(helper.make_node("Clip", ["y", "lo", "hi"], ["out"]))
        feeds |= {"lo": np.float32(extra["min"]), "hi": np.float32(extra["max"])}
    elif activation is not None:
        nodes.append(helper.make_node(activation, ["y"], ["out"], **extra))
    output = "out" if activation is not None else "y"
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, np.shape(v)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def _channels_last(x: np.ndarray, pad: int) -> np.ndarray:
    """x (N, C, H, W) as a kernel's channels-last result: a view of an (N, H + pad, W + pad, C)
    buffer, cropped."""
    n, c, height, width = x.shape
    buffer = np.full((n, height + pad, width + pad, c), np.nan, dtype=x.dtype)
    view = buffer[:, :height, :width].transpose(0, 3, 1, 2)
    view[...] = x
    return view


@st.composite
def residual_cases(draw):
    """A 2-D conv (pointwise, 3x3 at stride 1 or 2 with few or many channels, depthwise, grouped,
    a 7x7 stem, or 2x2 patches), its residual, an activation, and the layouts its input and
    residual arrive in."""
    kinds = ["1x1", "3x3", "3x3s2", "wide", "wides2", "depthwise", "grouped", "7x7s2", "patch"]
    kind = draw(st.sampled_from(kinds))
    kernel = {"1x1": 1, "7x7s2": 7, "patch": 2}.get(kind, 3)
    strided = kind in ("3x3s2", "wides2", "7x7s2", "patch") or (
        kind in ("1x1", "depthwise") and draw(st.booleans())
    )
    stride = 2 if strided else 1
    c = draw(st.integers(16, 20) if kind.startswith("wide") else st.integers(1, 9)) * (
        2 if kind == "grouped" else 1
    )
    group = {"depthwise": c, "grouped": 2}.get(kind, 1)
    m = c if kind == "depthwise" else draw(st.integers(1, 12)) * (2 if kind == "grouped" else 1)
    size = draw(st.integers(kernel, 20))
    pad = 0 if kernel in (1, 2) else kernel // 2
    attrs = {"pads": [pad] * 4, "strides": [stride, stride], "group": group, "kernel_shape": [kernel, kernel]}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 2))
    x = rng.standard_normal((n, c, size, size + draw(st.integers(0, 3)))).astype(np.float32)
    w = rng.standard_normal((m, c // group, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    out = [(d + 2 * pad - kernel) // stride + 1 for d in x.shape[2:]]
    r = rng.standard_normal((n, m, *out)).astype(np.float32) * 3
    activation = draw(st.sampled_from(RESIDUAL_ACTIVATIONS))
    layouts = draw(st.tuples(st.booleans(), st.booleans(), st.integers(0, 2)))
    return [x, w, b, r], attrs, activation, layouts


def _laid_out(inputs: list, layouts: tuple[bool, bool, int]) -> list:
    x, w, b, r = inputs
    x_last, r_last, pad = layouts
    return [_channels_last(x, pad) if x_last else x, w, b, _channels_last(r, pad) if r_last else r]


@SETTINGS
@given(residual_cases())
def test_every_fused_conv_candidate_adds_the_residual_before_the_activation(case):
    inputs, attrs, activation, layouts = case
    model, feeds = _reference_model(inputs, attrs, activation)
    want = run_reference(model, feeds)[0]
    attrs = with_activation(attrs, activation)
    args = _laid_out(inputs, layouts)
    kernels = [*CANDIDATES["FusedConv"](attrs, [None if a is None else a.shape for a in args])]
    kernels += [
        fused.fused_conv,
        fused.select_fused_conv(attrs, [a.shape if a is not None else None for a in args]),
    ]
    for kernel in kernels:
        residual = args[3].copy()
        got = kernel(with_packed(kernel, args, attrs), attrs)[0]
        assert got.shape == want.shape and got.dtype == want.dtype, kernel.__name__
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()), err_msg=kernel.__name__
        )
        np.testing.assert_array_equal(args[3], residual, err_msg=f"{kernel.__name__} wrote its residual")
        assert_own_result(got, args)


@SETTINGS
@given(residual_cases())
def test_every_conv_candidate_reads_a_channels_last_input(case):
    """A channels-last input (another kernel's result) gives the same result as NCHW; the
    result is the kernel's own memory, which the next kernel's call leaves alone."""
    inputs, attrs, _, layouts = case
    x, w, b, _ = inputs
    plain = [x, w] if b is None else [x, w, b]
    names = ["x", "w", "b"][: len(plain)]
    onnx_attrs = {k: v for k, v in attrs.items() if k != "kernel_shape"}
    graph = helper.make_graph(
        [helper.make_node("Conv", names, ["y"], **onnx_attrs)],
        "conv",
        [
            helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
            for k, v in zip(names, plain, strict=True)
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = run_reference(model, dict(zip(names, plain, strict=True)))[0]
    args = [_channels_last(x, layouts[2]), *plain[1:]]
    for kernel in conv.conv_candidates(attrs, [a.shape for a in args]):
        got = kernel(with_packed(kernel, args, attrs), attrs)[0]
        kept = got.copy()
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()), err_msg=kernel.__name__
        )
        assert_own_result(got, args)
        kernel(with_packed(kernel, [x * 2, *plain[1:]], attrs), attrs)  # reuses the scratch buffers
        np.testing.assert_array_equal(got, kept, err_msg=kernel.__name__)


def test_a_residual_of_another_shape_is_refused_by_every_kernel():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3], "activation": "Relu"}
    broadcast = np.ones((1, 16, 1, 1), np.float32)
    for kernel in CANDIDATES["FusedConv"](attrs, [x.shape, w.shape, None, broadcast.shape]):
        with pytest.raises(ValueError, match="residual"):
            kernel(with_packed(kernel, [x, w, None, broadcast], attrs), attrs)


def test_the_selector_applies_a_relu_once_after_a_kernel_that_clips():
    """FERRY_KERNEL_SEARCH=0: select_fused_conv picks the depthwise kernel, which clips in its
    last pass itself; a LeakyRelu it does not fuse is still applied after it."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    shapes = [x.shape, w.shape]
    base = {"pads": [1, 1, 1, 1], "group": 4, "kernel_shape": [3, 3]}
    assert conv.select_conv(base, shapes).fuses_clip
    for activation in ("Relu", "LeakyRelu"):
        attrs = with_activation(base, activation)
        plain = conv.conv_im2col([x, w], base)[0]
        want = (
            np.maximum(plain, 0)
            if activation == "Relu"
            else np.where(plain >= 0, plain, plain * np.float32(0.1))
        )
        got = fused.select_fused_conv(attrs, shapes)([x, w], attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- the converter's fusion, on small models, against onnxruntime --------------------------------


def _init(rng, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes, inits, x_shape: list, output: str, y_shape: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "residual_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, y_shape)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def resnet_blocks(seed: int = 0) -> onnx.ModelProto:
    """An identity block then a downsampling one (3x3/2 body, 1x1/2 shortcut), each ending in
    Add -> Relu, as ResNet18's."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "a1", "ab1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "a2", "ab2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Add", ["c2", "x"], ["s1"]),
        n("Relu", ["s1"], ["o1"]),
        n("Conv", ["o1", "d1", "db1"], ["e1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Relu", ["e1"], ["f1"]),
        n("Conv", ["f1", "d2", "db2"], ["e2"], pads=[1, 1, 1, 1]),
        n("Conv", ["o1", "down"], ["sc"], strides=[2, 2]),
        n("Add", ["e2", "sc"], ["s2"]),
        n("Relu", ["s2"], ["y"]),
    ]
    inits = [
        _init(rng, "a1", 8, 8, 3, 3),
        _init(rng, "ab1", 8),
        _init(rng, "a2", 8, 8, 3, 3),
        _init(rng, "ab2", 8),
        _init(rng, "d1", 16, 8, 3, 3),
        _init(rng, "db1", 16),
        _init(rng, "d2", 16, 16, 3, 3),
        _init(rng, "db2", 16),
        _init(rng, "down", 16, 8, 1, 1),
    ]
    return _model(nodes, inits, ["n", 8, 12, 12], "y", ["n", 16, 6, 6])


def inverted_residuals(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2's blocks: expand 1x1 -> Clip 0..6 -> depthwise 3x3 -> Clip -> project 1x1,
    plus the block's input (no activation after the Add), twice in a row; the second block's
    residual is the first one's output, which its expand conv reads too."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [
        n("Constant", [], ["zero"], value_float=0.0),
        n("Constant", [], ["six"], value_float=6.0),
    ]
    inits = []
    previous = "x"
    for block in range(2):
        p = f"b{block}"
        nodes += [
            n("Conv", [previous, f"{p}e", f"{p}eb"], [f"{p}c1"]),
            n("Clip", [f"{p}c1", "zero", "six"], [f"{p}r1"]),
            n("Conv", [f"{p}r1", f"{p}d", f"{p}db"], [f"{p}c2"], group=24, pads=[1, 1, 1, 1]),
            n("Clip", [f"{p}c2", "zero", "six"], [f"{p}r2"]),
            n("Conv", [f"{p}r2", f"{p}p", f"{p}pb"], [f"{p}c3"]),
            n("Add", [previous, f"{p}c3"], [f"{p}y"]),
        ]
        inits += [
            _init(rng, f"{p}e", 24, 6, 1, 1),
            _init(rng, f"{p}eb", 24),
            _init(rng, f"{p}d", 24, 1, 3, 3),
            _init(rng, f"{p}db", 24),
            _init(rng, f"{p}p", 6, 24, 1, 1),
            _init(rng, f"{p}pb", 6),
        ]
        previous = f"{p}y"
    return _model(nodes, inits, [1, 6, 10, 10], previous, [1, 6, 10, 10])


def _convert_and_run(model: onnx.ModelProto, feeds: dict, directory: Path) -> tuple[list, list, Session]:
    """onnxruntime's outputs for the model, and its converted package's nodes and Session."""
    onnxruntime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    path = directory / "m.ferry"
    convert(model, path)
    return onnxruntime.run(None, feeds), read_package(path).graph["nodes"], Session(path, threads=1)


@pytest.mark.parametrize(
    ("build", "shape"), [(resnet_blocks, (2, 8, 12, 12)), (inverted_residuals, (1, 6, 10, 10))]
)
def test_converted_skip_connections_run_as_fused_convs_and_match_onnxruntime(build, shape, tmp_path):
    model = build()
    feeds = {"x": np.random.default_rng(5).standard_normal(shape).astype(np.float32)}
    want, nodes, session = _convert_and_run(model, feeds, tmp_path)
    runs = [session.run(feeds) for _ in range(3)]  # unplanned, planned (searched), planned
    ops = [node["op"] for node in nodes]
    assert "Add" not in ops and "Relu" not in ops
    residual = [node for node in nodes if node["op"] == "FusedConv" and len(node["inputs"]) == 4]
    assert len(residual) == 2
    for got in runs:
        name = model.graph.output[0].name
        np.testing.assert_allclose(got[name], want[0], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[0]).max()))


def test_the_converter_fuses_no_broadcast_shared_or_activated_operand():
    """Left as Add: a residual that broadcasts, a conv output read twice, a conv with its own
    activation (which must come before the add)."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Add", ["c1", "bias_map"], ["s1"]),  # broadcast [1, 4, 1, 1]
        n("Conv", ["s1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Add", ["c2", "s1"], ["s2"]),
        n("Mul", ["c2", "s2"], ["m"]),  # c2 read twice
        n("Conv", ["m", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        n("Relu", ["c3"], ["r3"]),
        n("Add", ["r3", "m"], ["y"]),  # r3 = Relu(conv): the conv's activation comes first
    ]
    inits = [
        _init(rng, "w1", 4, 4, 3, 3),
        _init(rng, "w2", 4, 4, 3, 3),
        _init(rng, "w3", 4, 4, 3, 3),
        numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "bias_map"),
    ]
    model = _model(nodes, inits, [1, 4, 6, 6], "y", [1, 4, 6, 6])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = translate(inferred, 17)
    for step in optimize.PASSES[: optimize.PASSES.index(optimize.fuse_residual_add) + 1]:
        graph = step(graph)
    assert [node["op"] for node in graph.nodes].count("Add") == 3
    assert all(len(node["inputs"]) <= 3 for node in graph.nodes if node["op"].endswith("Conv"))


def test_the_residual_stays_intact_until_the_fused_conv_reads_it(tmp_path):
    """The residual r is also read after the fused conv, and an elementwise node before the conv
    could run in place: the planner must not hand r's buffer to it, nor the conv write into r."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0", "b0"], ["r"], pads=[1, 1, 1, 1]),  # r: a conv's (channels-last) result
        n("Sigmoid", ["r"], ["g"]),  # dies here... but r does not
        n("Conv", ["g", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
        n("Add", ["c", "r"], ["s"]),
        n("Relu", ["s"], ["t"]),
        n("Neg", ["r"], ["later"]),  # r read again after the fused conv
        n("Add", ["t", "later"], ["y"]),
    ]
    inits = [
        _init(rng, "w0", 8, 8, 3, 3),
        _init(rng, "b0", 8),
        _init(rng, "w1", 8, 8, 3, 3),
        _init(rng, "b1", 8),
    ]
    model = _model(nodes, inits, [1, 8, 16, 16], "y", [1, 8, 16, 16])
    feeds = {"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    (want,), _, session = _convert_and_run(model, feeds, tmp_path)
    runs = [session.run(feeds)["y"] for _ in range(3)]
    profile = session.profile(feeds)
    ops = [record.op for record in profile]
    assert ops == ["Conv", "Sigmoid", "FusedConv", "Neg", "Add"]
    fused_at = max(i for i, record in enumerate(profile) if record.op == "FusedConv")
    overwrites = [i for i, record in enumerate(profile) if "in place on r" in record.note.split(", ")]
    assert all(i > fused_at for i in overwrites)  # only r's last reader, Neg, may reuse it
    for got in runs:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_a_conv_whose_residual_is_made_after_it_moves_to_the_add(tmp_path):
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        n("Tanh", ["x"], ["r"]),  # made after the conv
        n("Add", ["r", "c"], ["s"]),
        n("Constant", [], ["lo"], value_float=-0.25),
        n("Constant", [], ["hi"], value_float=0.5),
        n("Clip", ["s", "lo", "hi"], ["y"]),
    ]
    model = _model(nodes, [_init(rng, "w", 5, 5, 3, 3)], [2, 5, 7, 9], "y", [2, 5, 7, 9])
    feeds = {"x": rng.standard_normal((2, 5, 7, 9)).astype(np.float32)}
    (want,), nodes, session = _convert_and_run(model, feeds, tmp_path)
    runs = [session.run(feeds)["y"] for _ in range(3)]
    assert [node["op"] for node in nodes] == ["Tanh", "FusedConv"]
    assert nodes[1]["inputs"][2:] == ["", "r"] and nodes[1]["attrs"]["activation"] == "Clip"
    for got in runs:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
