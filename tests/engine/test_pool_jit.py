"""pool_jit (engine/ops/pool_jit.py): MaxPool of a channels-last input in one JIT pass, against
numpy's MaxPool and onnxruntime over windows, strides, pads, dilations, ceil mode
and edge values (NaN as numpy's form keeps it); other inputs fall back to numpy's kernel; it is
a candidate for MaxPool, loaded only beside the conv kernels, and ResNet's stem pool picks it.
Skipped without numba or with FERRY_JIT=0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from engine import Session, jit, kernels
from engine.jit_needs import RIDER_OPS
from engine.ops.pool import max_pool
from tests.engine.helpers import run_onnxruntime, single_node_model, write_model_package

pytestmark = pytest.mark.skipif(not jit.enabled(), reason="numba is not installed (or FERRY_JIT=0)")


@pytest.fixture(scope="module")
def pool_jit():
    return jit.module("engine.ops.pool_jit")


def _channels_last(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@st.composite
def pools(draw):
    kernel = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    attrs = {
        "kernel_shape": kernel,
        "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))],
        "dilations": [draw(st.integers(1, 2)), draw(st.integers(1, 2))],
        "pads": [draw(st.integers(0, k - 1)) for k in kernel] + [draw(st.integers(0, k - 1)) for k in kernel],
        "ceil_mode": draw(st.integers(0, 1)),
    }
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, attrs["dilations"], strict=True)]
    shape = (
        draw(st.integers(1, 2)),
        draw(st.integers(2, 19)),
        *(draw(st.integers(e, e + 12)) for e in extent),
    )
    return shape, attrs


@settings(max_examples=60, deadline=None)
@given(pools(), st.booleans(), st.integers(0, 2**32 - 1))
def test_a_channels_last_max_pool_matches_numpy_and_the_reference(pool_jit, case, edges, seed):
    shape, attrs = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if edges:
        for value in (np.inf, -np.inf, np.nan, -0.0, 3e38):
            x[tuple(int(rng.integers(0, s)) for s in x.shape)] = value
    got = pool_jit.max_pool_jit([_channels_last(x)], attrs)[0]
    assert got.transpose(0, 2, 3, 1).flags.c_contiguous  # left channels last for the next conv
    np.testing.assert_array_equal(got, max_pool([x], attrs)[0])  # NaN where numpy's has it
    # onnxruntime is the oracle, as in test_conv_kernels: the reference evaluator's pooling is
    # wrong for asymmetric pads and ceil_mode; it drops a NaN, numpy's form keeps it (np.maximum)
    clean = np.where(np.isnan(x), np.float32(0), x)
    model, feeds = single_node_model("MaxPool", [clean], attrs, opset=19)
    (want,) = run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(pool_jit.max_pool_jit([_channels_last(clean)], attrs)[0], want)


def test_other_inputs_fall_back_to_numpy(pool_jit):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    rng = np.random.default_rng(0)
    nchw = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    doubles = _channels_last(nchw.astype(np.float64))
    volume = rng.standard_normal((1, 4, 6, 6, 6)).astype(np.float32)
    volume_attrs = {"kernel_shape": [2, 2, 2]}
    for x, given_attrs in ((nchw, attrs), (doubles, attrs), (volume, volume_attrs)):
        got = pool_jit.max_pool_jit([x], given_attrs)[0]
        np.testing.assert_array_equal(got, max_pool([x], given_attrs)[0])
        assert got.dtype == x.dtype


def test_it_is_a_max_pool_candidate_that_never_brings_numba_in(pool_jit):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    found = kernels.candidates("MaxPool", attrs, [(1, 64, 112, 112)])
    assert found[0] is max_pool and pool_jit.max_pool_jit in found
    assert kernels.candidates("MaxPool", {"kernel_shape": [2, 2, 2]}, [(1, 4, 6, 6, 6)]) == [max_pool]
    assert "MaxPool" in RIDER_OPS


def test_resnets_stem_pool_runs_on_it(tmp_path, pool_jit):
    """A 7x7/2 conv stem then its 3x3/2 pool, as ResNet18 opens: the JIT stem leaves its result
    channels last, the search keeps the JIT pool (one pass against numpy's four) and the
    session's result is numpy-only's."""
    rng = np.random.default_rng(3)
    weights = numpy_helper.from_array(rng.standard_normal((64, 3, 7, 7)).astype(np.float32) * 0.1, "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3]),
        helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 112, 112])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 28, 28])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, 3, 112, 112)).astype(np.float32)}
    path = write_model_package(model, tmp_path / "stem.ferry", feeds)
    jit_session, numpy_session = Session(path, threads=1), Session(path, threads=1, jit=False)
    for _ in range(3):
        got = jit_session.run(feeds)["y"]
    np.testing.assert_allclose(got, numpy_session.run(feeds)["y"], rtol=1e-4, atol=1e-4)
    kernels_run = {t.op: t.kernel for t in jit_session.profile(feeds)}
    assert kernels_run["MaxPool"].endswith("max_pool_jit"), kernels_run
