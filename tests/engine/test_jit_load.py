"""What a Session compiles when it is created (engine/jit.py's load): parallel variants only for
sessions allowed more than one thread, and no module none of the model's nodes can use."""

from __future__ import annotations

import numpy as np
import pytest

from engine import jit
from engine.diffusion import flash
from engine.ops.registry import REGISTRY
from engine.program import Program, Step

needs_numba = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off or numba is missing")


def _double(x, out):  # noqa: ANN001, ANN202 - compiled by the test below
    for i in range(x.shape[0]):
        out[i] = 2 * x[i]


def _double_parallel(x, out):  # noqa: ANN001, ANN202 - compiled with parallel=True below
    out[:] = 2 * x


def _kernels() -> tuple:
    """A serial / parallel pair, declared as the engine's kernel modules declare theirs (at
    module level: numba's disk cache keeps no closures)."""
    from numba import types  # noqa: PLC0415 - numba is optional

    jit.set_cache_dir(jit.cache_dir())  # numba's cache where the engine's kernels go, not __pycache__
    signature = types.void(jit.array(types.float32, 1, "C", readonly=True), jit.array(types.float32, 1, "C"))
    return jit.njit([signature])(_double), jit.njit([signature], parallel=True)(_double_parallel)


@needs_numba
def test_a_parallel_variant_waits_until_a_caller_may_use_threads():
    serial, parallel = _kernels()
    assert len(serial.signatures) == 1  # compiled when declared
    assert parallel.signatures == []  # not yet: a one-thread session never runs it
    x, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    jit.run(serial, parallel, x, out)
    assert parallel.signatures == []  # one thread: the serial variant ran
    np.testing.assert_array_equal(out, 2 * x)
    out[:] = 0
    with jit.thread_limit(2):
        jit.run(serial, parallel, x, out)
    assert len(parallel.signatures) == 1  # compiled for its declared signature, once needed
    np.testing.assert_array_equal(out, 2 * x)
    with pytest.raises(TypeError):  # and for no other: a run never compiles
        parallel(x.astype(np.float64), out.astype(np.float64))


@needs_numba
def test_loading_for_several_threads_compiles_the_parallel_variants():
    jit.load(ops=["GroupNormalization"], threads=2)
    group_norm_jit = jit.module("engine.ops.group_norm_jit")
    assert len(group_norm_jit._groups.signatures) == 1
    assert len(group_norm_jit._groups_parallel.signatures) == 1


def _attention(views: list | None) -> Step:
    attrs = {"scale": 0.125} if views is None else {"scale": 0.125, "views": views}
    return Step("attention", "FusedAttention", REGISTRY.get("FusedAttention"), None, attrs, [], [])


def _view(queries: int, head: int) -> dict:
    return {"offset": 0, "shape": [1, 4, queries, head], "strides": [0, head, 4 * head, 1]}


def test_flash_attention_is_ruled_out_only_by_a_static_view_too_short_or_too_wide():
    assert not flash.may_serve(_attention([_view(197, 64), None, None]).attrs)  # ViT-Tiny
    assert not flash.may_serve(_attention([_view(1024, 128), None, None]).attrs)  # wide heads
    assert flash.may_serve(_attention([_view(1024, 8), None, None]).attrs)  # a UNet's self-attention
    assert flash.may_serve(_attention(None).attrs)  # shapes known only in a run


def test_a_session_skips_flash_attention_when_no_attention_node_can_use_it():
    from engine.jit_needs import jit_unused as _jit_unused  # noqa: PLC0415

    def program(*steps: Step) -> Program:
        return Program(list(steps), {}, [], [], 17)

    short = _attention([_view(128, 32), None, None])
    assert _jit_unused(program(short, short)) == {"engine.diffusion.attention_jit"}
    assert _jit_unused(program(short, _attention(None))) == set()
    assert _jit_unused(program(short, _attention([_view(1024, 8), None, None]))) == set()
