"""int8 weights on the dot layout (gemv.py) and their kernels (dot_jit.py's ``gemv_dot8`` and
``gemm8``): the layout holds the same values, every path (JIT GEMV and GEMM, the one-call layer,
numpy) gives the float64 product of the same rounded activations and stored weights (the int32
sums are exact: only the float scaling rounds), packages written before it still load and run,
and the kernels compile and agree on a CPU without AVX-512 VNNI (the generic IR)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.llm.convert import _int8_activations
from engine import jit
from engine.llm import gemv
from engine.llm.checkpoint import load_checkpoint
from engine.llm.model import LlmModel, LlmWeights, weights_from_checkpoint
from engine.llm.package import load_model, serialize
from engine.llm.weights import Matrix, gemv_kernel, make_matrix
from tests.engine.llm.checkpoints import write_checkpoint

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
DOT = gemv.DOT_GROUP


def _weights(n: int, k: int, seed: int) -> tuple[np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 3.0, (n, 1)).astype(np.float32)
    return w, rng


def _reference(matrix: Matrix, x: np.ndarray) -> np.ndarray:
    """float64 product of x rounded per block of 32 and the stored int8 weights."""
    rounded = gemv.quantize_activations(x, 32).astype(np.float64)
    return rounded @ matrix.dense().astype(np.float64).T


def test_the_int8_dot_layout_holds_the_plain_bytes_plus_128() -> None:
    w, _ = _weights(48, 96, 1)
    q, scale = gemv.quantize_int8(w)
    matrix = make_matrix(w, "int8", activations="int8")
    assert (matrix.block, matrix.group, matrix.activations) == (32, DOT, "int8")
    dot = matrix.arrays["q"]
    assert dot.dtype == np.uint8 and dot.shape == q.shape
    np.testing.assert_array_equal(matrix.arrays["scale"], scale)
    # byte 4j + t of row 16v + g sits at [v, j, g, t], plus 128
    assert int(dot.reshape(3, 24, 16, 4)[2, 13, 5, 2]) == int(q[37, 54]) + 128
    np.testing.assert_array_equal(gemv.int8_from_dot(dot), q)
    index = np.array([47, 0, 16, 16, 5])
    np.testing.assert_array_equal(gemv.int8_dot_rows(dot, index), q[index])
    np.testing.assert_array_equal(matrix.dense(), q.astype(np.float32) * scale[:, None])
    matrix.check("m", (48, 96))
    # float activations, rows 16 does not divide, or inputs 32 does not: the plain layout
    for plain in (make_matrix(w, "int8"), make_matrix(w[:40], "int8", activations="int8")):
        assert plain.arrays["q"].dtype == np.int8 and plain.group == 1
    assert make_matrix(w[:, :80], "int8", activations="int8").group == 1


def test_a_matrix_that_claims_the_layout_with_the_wrong_bytes_is_refused() -> None:
    w, _ = _weights(32, 64, 2)
    matrix = make_matrix(w, "int8", activations="int8")
    matrix.arrays["q"] = gemv.int8_from_dot(matrix.arrays["q"])  # int8 bytes, dot layout claimed
    with pytest.raises(ValueError, match="wants"):
        matrix.check("m", (32, 64))
    odd = Matrix("int8", (40, 64), {"q": np.zeros((40, 64), np.uint8), "scale": np.ones(40, np.float32)})
    odd.block, odd.group, odd.activations = 32, DOT, "int8"
    with pytest.raises(ValueError, match="cannot hold"):
        odd.check("m", (40, 64))


def test_the_converter_lays_out_its_int8_matrices_once() -> None:
    rng = np.random.default_rng(3)
    head = make_matrix(rng.standard_normal((64, 96)).astype(np.float32), "int8")
    odd = make_matrix(rng.standard_normal((24, 96)).astype(np.float32), "int8")
    before = head.dense(), odd.dense()
    # tied: the embedding is the head, laid out once
    weights = LlmWeights(embed=head, lm_head=head, norm=np.ones(96, np.float32), layers=[])
    _int8_activations(weights)
    weights = LlmWeights(embed=odd, lm_head=head, norm=np.ones(96, np.float32), layers=[])
    _int8_activations(weights)
    assert (head.group, head.activations, head.block, head.arrays["q"].dtype) == (DOT, "int8", 32, np.uint8)
    assert (odd.group, odd.activations, odd.arrays["q"].dtype) == (1, "float", np.int8)
    for matrix, dense in zip((head, odd), before, strict=True):  # the same values, re-laid only
        np.testing.assert_array_equal(matrix.dense(), dense)


@settings(max_examples=20, deadline=None)
@given(
    tokens=st.integers(1, 3), vectors=st.integers(1, 3), blocks=st.integers(1, 5), seed=st.integers(0, 2**16)
)
def test_the_numpy_path_gives_the_product_of_the_rounded_values(
    tokens: int, vectors: int, blocks: int, seed: int
) -> None:
    w, rng = _weights(16 * vectors, 32 * blocks, seed)
    matrix = make_matrix(w, "int8", activations="int8")
    x = rng.standard_normal((tokens, 32 * blocks)).astype(np.float32)
    expected = _reference(matrix, x)
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * np.abs(expected).max()}
    found = gemv.gemm_int8_dot(x, matrix.arrays["q"], matrix.arrays["scale"])
    np.testing.assert_allclose(found, expected, **tolerance)
    inputs = [x[0], matrix.arrays["q"], matrix.arrays["scale"]]
    np.testing.assert_allclose(gemv.gemv_int8_numpy(inputs, {})[0], expected[0], **tolerance)


@needs_jit
@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 17),
    vectors=st.integers(1, 4),
    blocks=st.integers(1, 5),  # K = 32, 96, 160: not multiples of 64
    seed=st.integers(0, 2**16),
)
def test_the_gemv_and_gemm_give_the_products_of_the_rounded_values(
    tokens: int, vectors: int, blocks: int, seed: int
) -> None:
    w, rng = _weights(16 * vectors, 32 * blocks, seed)
    matrix = make_matrix(w, "int8", activations="int8")
    x = rng.standard_normal((tokens, 32 * blocks)).astype(np.float32)
    x *= rng.uniform(0.1, 10.0, (tokens, 1)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: d_x = 0
    expected = _reference(matrix, x)
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * np.abs(expected).max()}
    found = matrix.gemm(x)  # dot_jit.gemm8
    assert found.shape == expected.shape and found.dtype == np.float32
    np.testing.assert_allclose(found, expected, **tolerance)
    kernel = gemv_kernel("LlmGemvInt8")
    for t in range(tokens):  # dot_jit.gemv_dot8, through the kernel layer
        found_t = kernel([x[t], matrix.arrays["q"], matrix.arrays["scale"]], {})[0]
        np.testing.assert_allclose(found_t, expected[t], **tolerance)
    numpy_path = gemv.gemm_int8_dot(x, matrix.arrays["q"], matrix.arrays["scale"])
    np.testing.assert_allclose(found, numpy_path, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def _extremes(k: int) -> tuple[Matrix, np.ndarray]:
    """Weights at -128 (stored as byte 0, which the converter never writes but a package may
    hold), -127 and +127, activations at their block's largest magnitude: the largest sums."""
    rows = 32
    q = np.full((rows, k), -128, np.int8)
    q[::2, 1::2] = 127
    q[1::4] = -127
    scale = np.linspace(0.5, 2.0, rows).astype(np.float32)
    arrays = {"q": gemv.int8_to_dot(q), "scale": scale}
    matrix = Matrix("int8", (rows, k), arrays, block=32, group=DOT, activations="int8")
    matrix.check("m", (rows, k))
    x = np.full(k, 3.0, np.float32)
    x[k // 2 :: 3] = -3.0
    return matrix, x


@needs_jit
@pytest.mark.parametrize("k", [32, 96, 128])
def test_the_dot_products_are_exact_at_the_extremes(k: int) -> None:
    matrix, x = _extremes(k)
    expected = matrix.dense().astype(np.float64) @ x  # x rounds to +-127 exactly: d_x = 3 / 127
    # exact int sums: only float32 scaling and the sum over sub-blocks round (a few ulps of the
    # largest output; rows whose sub-blocks cancel have small outputs)
    tolerance = {"rtol": 1e-6, "atol": 1e-6 * np.abs(expected).max()}
    np.testing.assert_allclose(matrix.gemv(x), expected, **tolerance)
    np.testing.assert_allclose(matrix.gemm(np.stack([x, -x])), np.stack([expected, -expected]), **tolerance)
    numpy_path = gemv.gemm_int8_dot(x[None, :], matrix.arrays["q"], matrix.arrays["scale"])[0]
    np.testing.assert_allclose(numpy_path, expected, **tolerance)


@needs_jit
def test_two_threads_give_one_threads_bits() -> None:
    w, rng = _weights(96, 192, 7)
    matrix = make_matrix(w, "int8", activations="int8")
    x = rng.standard_normal((13, 192)).astype(np.float32)
    serial = matrix.gemm(x)
    with jit.thread_limit(2):
        parallel = matrix.gemm(x)
    np.testing.assert_array_equal(parallel, serial)


_WITHOUT_VNNI = """
import sys
import numpy as np
from engine.llm import dot_jit, gemv
from engine.llm.weights import make_matrix
assert dot_jit.int_dot_ir.PATH == sys.argv[1], dot_jit.int_dot_ir.PATH
rng = np.random.default_rng(5)
w = rng.standard_normal((48, 96)).astype(np.float32)
x = rng.standard_normal((9, 96)).astype(np.float32)
for weights, block in (("int8", 32), ("int4", 32)):
    matrix = make_matrix(w, weights, block, activations="int8")
    expected = gemv.quantize_activations(x, 32).astype(np.float64) @ matrix.dense().astype(np.float64).T
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * np.abs(expected).max()}
    np.testing.assert_allclose(matrix.gemm(x), expected, **tolerance)
    np.testing.assert_allclose(matrix.gemv(x[3]), expected[3], **tolerance)
print("ok")
"""
# numba compiling for another CPU: skylake-avx512 has AVX-512 but no VNNI (the generic IR);
# haswell with its features named is int_dot_ir's AVX2 path (dot_small, dot_signed)
WITHOUT_VNNI = {
    "generic": {"NUMBA_CPU_NAME": "skylake-avx512"},
    "avx2": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,+bmi2"},
}


@needs_jit
@pytest.mark.parametrize("path", sorted(WITHOUT_VNNI))
def test_the_kernels_compile_and_agree_without_vnni(tmp_path: Path, path: str) -> None:
    """The int8 and int4 dot-layout kernels on each path a CPU without VNNI takes (own cache)."""
    import llvmlite.binding as llvm  # noqa: PLC0415 - only with the JIT tier

    if path == "avx2" and not llvm.get_host_cpu_features().get("avx2", False):
        pytest.skip("code compiled for AVX2 cannot run on this CPU")
    env = os.environ | WITHOUT_VNNI[path] | {"FERRY_JIT_CACHE": str(tmp_path / "jit")}
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_VNNI, path], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@needs_jit
def test_packages_from_before_the_int8_dot_layout_still_load_and_run(tmp_path: Path) -> None:
    """A package whose int8 matrices are int8 bytes without group or activations (as written
    before) loads and runs its float kernels; one written now records the layout and gives the
    same logits up to the activations' rounding."""
    source = tmp_path / "ckpt"
    source.mkdir()
    write_checkpoint(source, "llama")
    checkpoint = load_checkpoint(source)
    prompt = [3, 4, 5, 6]
    logits = {}
    for name in ("old", "new"):
        weights = weights_from_checkpoint(checkpoint, "int8", 32)
        if name == "new":
            _int8_activations(weights)
        directory = tmp_path / name
        directory.mkdir()
        index, data = serialize(checkpoint.config, weights, "int8", 32)
        (directory / "llm.json").write_bytes(index)
        (directory / "weights.bin").write_bytes(data)
        spec = json.loads(index)["matrices"]["layers.0.down"]
        loaded = load_model(directory)
        down = loaded.weights.layers[0].down
        if name == "old":
            assert "group" not in spec and "activations" not in spec and down.arrays["q"].dtype == np.int8
        else:
            assert (spec["group"], spec["activations"], spec["block"]) == (DOT, "int8", 32)
            assert down.arrays["q"].dtype == np.uint8 and down.group == DOT
        cache = loaded.new_cache()
        steps = [loaded.forward(prompt, cache)]
        steps += [loaded.forward([token], cache) for token in (7, 19)]  # decode: the fused layers
        expected = LlmModel(checkpoint.config, weights)
        expected_cache = expected.new_cache()
        np.testing.assert_array_equal(steps[0], expected.forward(prompt, expected_cache))
        logits[name] = np.stack(steps)
    scale = np.abs(logits["old"]).max()
    np.testing.assert_allclose(logits["new"], logits["old"], rtol=0, atol=0.05 * scale)
