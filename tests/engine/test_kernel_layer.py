"""The kernel layer (engine/kernels.py) and the JIT tier's switches (engine/jit.py), with or
without numba: these always run.  The JIT kernels themselves are in test_jit_kernels.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine import Session, jit, kernels, search
from engine.ops import conv
from engine.ops.registry import REGISTRY, kernel_name
from engine.program import Program, Step
from tests.engine.helpers import run_reference, single_node_model, write_model_package

DEPTHWISE = ({"group": 8, "pads": [1, 1, 1, 1]}, [(1, 8, 12, 12), (8, 1, 3, 3)])
QMATMUL = ({}, [(1, 1, 64), (64, 32), (32,), None, (32,)])
GELU_MATMUL = ({"activation": "Gelu"}, [(4, 64), (64, 32), (32,)])
CASES = [("Conv", DEPTHWISE), ("QMatMul", QMATMUL), ("FusedMatMul", GELU_MATMUL)]


def test_kernel_names_keep_the_conv_family_after_the_split_by_algorithm():
    """Cached search choices name kernels ``conv.<function>``, whichever file now holds them."""
    assert kernel_name(conv.conv_winograd) == "conv.conv_winograd"
    assert kernel_name(conv.conv_depthwise_flat) == "conv.conv_depthwise_flat"
    assert kernel_name(conv.conv_im2col_hwc) == "conv.conv_im2col_hwc"
    assert kernel_name(conv.conv_1x1) == "conv.conv_1x1"


@pytest.mark.parametrize(
    ("op", "case"), [("Conv", DEPTHWISE), ("QMatMul", QMATMUL), ("FusedMatMul", GELU_MATMUL)]
)
def test_numpy_only_candidates_are_numpy_kernels_with_the_default_first(op, case):
    attrs, shapes = case
    default = REGISTRY[op] if op != "Conv" else None
    found = kernels.candidates(op, attrs, shapes, default, use_jit=False)
    assert found and all(kernels.tier(k) == "numpy" for k in found)
    if default is not None:
        assert found == [default]
    else:
        assert found[0] is conv.select_conv(attrs, shapes)


@pytest.mark.parametrize(
    ("op", "case"), [("Conv", DEPTHWISE), ("QMatMul", QMATMUL), ("FusedMatMul", GELU_MATMUL)]
)
def test_jit_candidates_come_after_the_numpy_ones_only_with_numba(op, case):
    jit.load()  # every JIT module (a Session loads only those its model can use)
    attrs, shapes = case
    default = REGISTRY[op] if op != "Conv" else None
    found = kernels.candidates(op, attrs, shapes, default)
    tiers = [kernels.tier(k) for k in found]
    assert tiers == sorted(tiers, key=lambda t: t == "jit")  # numpy first
    assert ("jit" in tiers) == jit.enabled()


def test_a_legacy_opset_kernel_gets_no_jit_candidates():
    """Softmax before opset 13 flattens at its axis: its kernel is not the registry's, and a JIT
    kernel written for the current meaning must not be offered in its place."""
    legacy = object()
    assert kernels.candidates("Gelu", {}, [(2, 3)], default=legacy) == [legacy]


def test_ferry_jit_0_turns_the_tier_off(monkeypatch):
    monkeypatch.setenv("FERRY_JIT", "0")
    assert not jit.enabled()
    assert jit.fingerprint() == "numpy-only"
    assert jit.load() == 0.0
    assert jit.loaded() == []
    assert kernels.ops() == frozenset(kernels.NUMPY)


def test_the_search_cache_key_changes_with_the_jit_tier():
    """Installing or upgrading numba (or turning the tier off) re-measures: the device
    fingerprint names the tier."""
    with_jit, without = search.device_fingerprint(1, True), search.device_fingerprint(1, False)
    assert (with_jit != without) == jit.enabled()


def test_the_search_cache_key_changes_with_the_engines_code(monkeypatch):
    """A kernel rewritten under its old name is a different speed: an engine upgrade re-measures."""
    before = search.device_fingerprint(1, True)
    monkeypatch.setattr(jit, "engine_digest", lambda: "another engine")
    assert search.device_fingerprint(1, True) != before


def test_the_jit_cache_directory_is_the_one_the_engine_is_told(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_JIT_CACHE", str(tmp_path / "from-env"))
    previous = jit._cache_dir
    try:
        jit._cache_dir = None
        assert jit.cache_dir() == tmp_path / "from-env"
        jit.set_cache_dir(tmp_path / "state" / "jit")
        assert jit.cache_dir() == tmp_path / "state" / "jit"
    finally:
        jit._cache_dir = previous
        if previous is not None or jit.enabled():
            jit.set_cache_dir(jit.cache_dir())


def test_compiled_kernels_are_kept_per_engine_version(tmp_path, monkeypatch):
    """numba keys a cached kernel on its own file; kernels inline other files' code, so the
    compiled kernels live under a digest of every engine source, and only a few other
    versions' are kept."""
    previous = jit._cache_dir
    try:
        jit._cache_dir = tmp_path
        current = jit.compiled_dir()
        assert current.parent == tmp_path and current.name == f"engine-{jit.engine_digest()}"
        stale = []
        for age in range(jit.KEPT_ENGINES + 2):
            other = tmp_path / f"engine-old{age}"
            other.mkdir()
            os.utime(other, (1_000_000 - age, 1_000_000 - age))  # old0 the newest
            stale.append(other)
        current.mkdir()
        jit._remove_stale(current)
        assert current.is_dir()
        assert [p.is_dir() for p in stale] == [True] * jit.KEPT_ENGINES + [False, False]
    finally:
        jit._cache_dir = previous


def test_a_session_loads_only_the_jit_kernels_its_model_can_use():
    """A model with no depthwise conv or int8 matmul needs no JIT module (nor numba's memory); a
    grouped conv needs the depthwise one; GELU's rides along only where numba is loaded anyway,
    or where an attention has many queries (an encoder's JIT kernels pay for numba there)."""
    from engine.jit_needs import jit_ops as _jit_ops  # noqa: PLC0415 - the session's own choice
    from engine.ops.fused import prepare_attention  # noqa: PLC0415

    def program(*nodes: tuple[str, dict]) -> Program:
        steps = [
            Step(f"n{i}", op, REGISTRY.get(op), None, attrs, [], []) for i, (op, attrs) in enumerate(nodes)
        ]
        return Program(steps, {}, [], [], 17)

    plain = program(("Conv", {}), ("Relu", {}), ("Gemm", {}))
    assert not _jit_ops(plain).intersection(*jit.MODULES.values())
    assert _jit_ops(program(("FusedConv", {"group": 32}), ("QMatMul", {}))) == {"FusedConv", "QMatMul"}
    gelu = ("FusedMatMul", {"activation": "Gelu"})
    assert _jit_ops(program(gelu, ("LayerNormalization", {}))) == set()  # GELU alone: not worth numba
    assert _jit_ops(program(gelu, ("QMatMul", {}))) == {"FusedMatMul", "QMatMul"}

    # a transformer's many-query attention (static views: ViT's 197 rows) brings them in; a
    # decode step's one query does not (the views as the converter writes, and as prepared)
    def attention(rows: int, prepare: bool = False) -> tuple[str, dict]:
        view = {"offset": 0, "shape": [1, 3, rows, 64], "strides": [0, 64, 576, 1]}
        attrs = {"views": [view, None, None]}
        return "FusedAttention", prepare_attention(attrs, 3, 1) if prepare else attrs

    many = _jit_ops(program(gelu, ("LayerNormalization", {}), attention(197)))
    assert many == {"FusedMatMul", "LayerNormalization", "FusedAttention"}
    assert _jit_ops(program(gelu, attention(197, prepare=True))) == {"FusedMatMul", "FusedAttention"}
    assert _jit_ops(program(gelu, ("LayerNormalization", {}), attention(1))) == set()
    assert _jit_ops(program(gelu, ("FusedAttention", {}))) == set()  # no static views: unknown


def test_a_numpy_only_session_runs_numpy_kernels_and_matches_the_reference(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    model, feeds = single_node_model("Conv", [x, w], DEPTHWISE[0])
    path = write_model_package(model, tmp_path / "m.ferry", feeds)
    session = Session(path, threads=1, jit=False)
    assert session.jit is False
    session.run(feeds)
    timings = session.profile(feeds)
    assert "jit" not in timings[0].kernel
    np.testing.assert_allclose(
        session.run(feeds)["out0"], run_reference(model, feeds)[0], rtol=1e-5, atol=1e-5
    )
    assert Session(path, threads=1).jit == jit.enabled()
