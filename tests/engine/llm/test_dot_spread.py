"""Decode's large GEMVs on two threads (dot_jit.spread_gemv): the serial kernels' bits."""

from __future__ import annotations

import numpy as np
import pytest

from engine import jit
from engine.llm.weights import make_matrix

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")


@needs_jit
@pytest.mark.parametrize(("precision", "options"), [("int4", {"block": 32}), ("int8", {})])
def test_a_gemv_spread_over_two_threads_gives_one_threads_bits(
    precision: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    w = rng.standard_normal((160, 96)).astype(np.float32)
    matrix = make_matrix(w, precision, activations="int8", **options)
    x = rng.standard_normal(96).astype(np.float32)
    serial = matrix.gemv(x)
    dot = jit.module("engine.llm.dot_jit")
    monkeypatch.setattr(dot, "PARALLEL_MIN_WEIGHTS", 0)  # this small matrix spreads too
    calls = []
    original = jit.run
    monkeypatch.setattr(
        jit,
        "run",
        lambda serial_kernel, parallel, *args: (
            calls.append(parallel) or original(serial_kernel, parallel, *args)
        ),
    )
    with jit.thread_limit(2):
        parallel = matrix.gemv(x)
    assert calls and calls[0].__name__.endswith("_parallel")
    np.testing.assert_array_equal(parallel, serial)
    assert np.abs(serial).max() > 0
