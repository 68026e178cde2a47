"""GEGLU fused (converter/passes/fuse_geglu.py -> FusedGeglu, engine/ops/geglu.py and its JIT
twin in rows_jit.py): the pass against onnxruntime on the graph torch exports, what it leaves
alone, and the kernels (hypothesis over shapes and edge values) against onnx's
ReferenceEvaluator on the unfused Slice / Gelu / Mul nodes."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter import convert
from converter.passes import fuse_geglu, fuse_gelu
from converter.translate import translate
from engine import Session
from engine import jit as jit_tier
from engine.ops.geglu import fused_geglu
from tests.converter.models import fvalue, model
from tests.converter.passes.checks import const, ops
from tests.engine.helpers import run_reference

RNG = np.random.default_rng(33)
INT64_MAX = np.iinfo(np.int64).max


def ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def feed_forward(width: int, inner: int, gate_bounds=None, axis: int = -1, extra_reader: bool = False):
    """x -> MatMul + Add (to 2 * inner) -> chunk(2, -1) as two Slices -> erf GELU of the second
    half (Div, Erf, Add, Mul, Mul, as torch exports it) times the first -> MatMul: diffusers'
    GEGLU feed-forward.  ``gate_bounds`` overrides the gate's (start, end); ``extra_reader``
    also outputs the gate slice."""
    start, end = gate_bounds or (inner, 2 * inner)
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["proj0"]),
        helper.make_node("Add", ["proj0", "b_in"], ["proj"]),
        helper.make_node("Slice", ["proj", "zero", "half", "axis"], ["value"]),
        helper.make_node("Slice", ["proj", "g_start", "g_end", "axis"], ["gate"]),
        helper.make_node("Div", ["gate", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["gate", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "point5"], ["gelu"]),
        helper.make_node("Mul", ["value", "gelu"], ["act"]),
        helper.make_node("MatMul", ["act", "w_out"], ["y"]),
    ]
    outputs = [fvalue("y", ["n", "t", width])]
    if extra_reader:
        outputs.append(fvalue("gate", None))
    initializers = [
        const("w_in", 0.3 * RNG.standard_normal((width, 2 * inner))),
        const("b_in", RNG.standard_normal(2 * inner)),
        const("w_out", 0.3 * RNG.standard_normal((inner, width))),
        ints("zero", [0]),
        ints("half", [inner]),
        ints("g_start", [start]),
        ints("g_end", [end]),
        ints("axis", [axis]),
        const("sqrt2", math.sqrt(2)),
        const("one", 1.0),
        const("point5", 0.5),
    ]
    return model(nodes, [fvalue("x", ["n", "t", width])], outputs, initializers)


def converted_graph(source: onnx.ModelProto):
    graph = translate(onnx.shape_inference.infer_shapes(source), 17)
    return fuse_geglu.run(fuse_gelu.run(graph))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("end", ["explicit", "int64 max"])
def test_fused_geglu_matches_onnxruntime(tmp_path, jit, threads, end):
    if jit and not jit_tier.enabled():
        pytest.skip("numba is not installed (or FERRY_JIT=0)")
    source = feed_forward(16, 24, gate_bounds=(24, 48 if end == "explicit" else INT64_MAX), axis=2)
    assert "FusedGeglu" in ops(converted_graph(source))
    x = (RNG.standard_normal((2, 37, 16)) * 3).astype(np.float32)
    report = convert(source, tmp_path / "m.ferry", selftest_inputs={"x": x})
    assert report.nodes_after < report.nodes_before
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    session = Session(tmp_path / "m.ferry", threads=threads, jit=jit)
    for _ in range(3):  # recorded, planned, then the plan's run
        np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def test_the_pass_fuses_the_halves_and_nothing_else():
    fused = converted_graph(feed_forward(8, 12))
    assert ops(fused) == ["MatMul", "Add", "FusedGeglu", "MatMul"]
    node = fused.nodes[2]
    assert node["inputs"] == ["proj"] and node["outputs"] == ["act"]
    assert node["attrs"] == {"half": 12, "approximate": "none"}
    unfused = ["MatMul", "Add", "Slice", "Slice", "Gelu", "Mul", "MatMul"]
    assert ops(converted_graph(feed_forward(8, 12, extra_reader=True))) == unfused  # gate read twice
    assert ops(converted_graph(feed_forward(8, 12, gate_bounds=(11, 23)))) == unfused  # not the halves
    assert ops(converted_graph(feed_forward(8, 12, axis=1))) == unfused  # not the last axis


@st.composite
def geglu_cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=3)))
    half = draw(st.integers(1, 70))
    extra = draw(st.sampled_from([0, 0, 3]))  # a last axis wider than 2 * half: the rest unread
    seed = draw(st.integers(0, 2**32 - 1))
    spread = draw(st.sampled_from([0.5, 3.0, 40.0]))
    x = (np.random.default_rng(seed).standard_normal((*lead, 2 * half + extra)) * spread).astype(np.float32)
    return x, half


def reference(x: np.ndarray, half: int) -> np.ndarray:
    """Slice, Slice, Gelu (opset 20), Mul on onnx's ReferenceEvaluator."""
    nodes = [
        helper.make_node("Slice", ["x", "zero", "half", "axis"], ["value"]),
        helper.make_node("Slice", ["x", "half", "end", "axis"], ["gate"]),
        helper.make_node("Gelu", ["gate"], ["gelu"]),
        helper.make_node("Mul", ["value", "gelu"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "geglu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[ints("zero", [0]), ints("half", [half]), ints("end", [2 * half]), ints("axis", [-1])],
    )
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return run_reference(source, {"x": x})[0]


EDGES = np.array([0.0, -0.0, 1e-30, -1e-30, 5.0, -5.0, 30.0, -30.0, 1e4, -1e4], np.float32)


@settings(max_examples=40, deadline=None)
@given(geglu_cases(), st.booleans())
@example((np.concatenate([np.full(10, 2.0, np.float32), EDGES])[None], 10), False)
def test_kernels_match_the_reference(case, two_threads):
    x, half = case
    want = reference(x, half)
    attrs = {"half": half, "approximate": "none"}
    # Ferry's GELU forms are within ~1e-6 absolute of the erf formula; the value multiplies that
    allowed = 1.5e-6 * np.abs(x[..., :half]) + 2e-6 * np.abs(want)
    got = fused_geglu([x], attrs)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.abs(got - want) <= allowed)
    if not jit_tier.enabled():
        return
    rows_jit = jit_tier.module("engine.ops.rows_jit")
    with jit_tier.thread_limit(2 if two_threads else 1):
        jitted = rows_jit.geglu_jit([x], attrs)[0]
    assert np.all(np.abs(jitted - want) <= allowed)
    assert np.all(np.abs(jitted - got) <= 2 * allowed)


def test_nan_infinities_and_a_too_narrow_input():
    x = np.array([[1.0, 2.0, np.nan, np.inf, 3.0, -1.0, 0.5, -np.inf]], np.float32)
    attrs = {"half": 4, "approximate": "none"}
    want = reference(x, 4)  # 1 * nan, 2 * gelu(inf) = inf, nan * gelu(0.5), inf * gelu(-inf) = nan
    kernels = [fused_geglu]
    if jit_tier.enabled():
        kernels.append(jit_tier.module("engine.ops.rows_jit").geglu_jit)
    for kernel in kernels:
        got = kernel([x], attrs)[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-6)
        with pytest.raises(ValueError, match="narrower than twice half"):
            kernel([x[:, :7]], attrs)


def test_float16_and_tanh_take_the_numpy_kernel():
    x = (RNG.standard_normal((3, 10)) * 2).astype(np.float32)
    exact = fused_geglu([x], {"half": 5})[0]
    tanh = fused_geglu([x], {"half": 5, "approximate": "tanh"})[0]
    inner = math.sqrt(2 / math.pi) * (x[:, 5:] + 0.044715 * x[:, 5:] ** 3)
    np.testing.assert_allclose(tanh, x[:, :5] * 0.5 * x[:, 5:] * (1 + np.tanh(inner)), rtol=1e-5, atol=1e-6)
    half = fused_geglu([x.astype(np.float16)], {"half": 5})[0]
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, exact, rtol=1e-2, atol=1e-2)
    if jit_tier.enabled():
        rows_jit = jit_tier.module("engine.ops.rows_jit")
        np.testing.assert_array_equal(rows_jit.geglu_jit([x], {"half": 5, "approximate": "tanh"})[0], tanh)
