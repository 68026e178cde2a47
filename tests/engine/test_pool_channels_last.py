"""MaxPool 3x3 / 2 (ResNet's stem pool) on a channels-last input: the same values as the NCHW
form and onnx's ReferenceEvaluator, over batch, channels, even sizes and edge values, and the
result stays channels last (NaN as the NCHW form leaves it).  numpy only: runs with FERRY_JIT=0 too."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ops.pool import max_pool
from tests.engine.helpers import run_reference, single_node_model

ATTRS = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 20),
    st.integers(1, 9),
    st.integers(1, 9),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_channels_last_stem_pool_matches_nchw_and_the_reference(n, c, half_h, half_w, edges, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, 2 * half_h, 2 * half_w)).astype(np.float32)
    if edges:
        for value in (np.inf, -np.inf, np.nan, -0.0, 3e38):
            x[tuple(int(rng.integers(0, s)) for s in x.shape)] = value
    channels_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    got = max_pool([channels_last], ATTRS)[0]
    assert got.transpose(0, 2, 3, 1).flags.c_contiguous  # left channels last for the next conv
    np.testing.assert_array_equal(got, max_pool([x], ATTRS)[0])
    # onnx's reference drops a NaN its comparisons meet; Ferry's NCHW form keeps it (np.maximum)
    clean = np.where(np.isnan(x), np.float32(0), x)
    model, feeds = single_node_model("MaxPool", [clean], ATTRS)
    (want,) = run_reference(model, feeds)
    clean_last = np.ascontiguousarray(clean.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(max_pool([clean_last], ATTRS)[0], want)
