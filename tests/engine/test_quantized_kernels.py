"""QMatMul / QGather against a float reference (dequantize, then matmul), with the weight cast a
block of rows at a time into a reused scratch buffer; and package loading that verifies every
file's sha256 without making the mapped weights resident."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter import quantize as quant
from engine import format as fmt
from engine.errors import PackageIntegrityError
from engine.ops import quantized
from engine.ops.quantized import block_rows, dequantize, qgather, qmatmul
from tests.engine.helpers import run_int8_matmul_reference
from tests.model_packages import write_package

SETTINGS = settings(max_examples=40, deadline=None)


def _array(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _reference(a: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """a @ weight (+ bias) in float64: what QMatMul computes in float32."""
    y = a.astype(np.float64) @ weight.astype(np.float64)
    return y if bias is None else y + bias


def _close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    """float32 accumulation over k terms: the error grows with k and the terms' size."""
    assert got.dtype == np.float32 and got.shape == want.shape
    size = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1, k) * size)


@st.composite
def int8_cases(draw):
    k, n = draw(st.integers(0, 70)), draw(st.integers(1, 40))
    lead = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=2)))  # M may be 0
    seed = draw(st.integers(0, 2**32 - 1))
    weight = _array(seed, (k, n))
    if k and draw(st.booleans()):
        weight[:, 0] = 0  # an all-zero column: scale 1
    a = _array(seed + 1, (*lead, k))
    bias = _array(seed + 2, (n,)) if draw(st.booleans()) else None
    scratch = draw(st.sampled_from([4, 64, 1000, 4 << 20]))  # bytes: 1 row, a few rows, all at once
    return a, weight, bias, scratch


@SETTINGS
@given(int8_cases())
def test_int8_qmatmul_matches_dequantize_then_matmul(case):
    a, weight, bias, scratch = case
    if weight.shape[0]:
        q, scale = quant.quantize_int8(weight, 1)
    else:  # K = 0: nothing to quantize, the product is zeros
        q, scale = weight.astype(np.int8), np.ones(weight.shape[1], np.float32)
    attrs = {"axis": 1}
    full = dequantize(q, scale, None, attrs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", scratch)
        (got,) = qmatmul([a, q, scale, None, bias], attrs)
    _close(got, _reference(a, full, bias), a.shape[-1])


@st.composite
def int4_cases(draw):
    block = draw(st.sampled_from([2, 4, 8]))
    k, n = draw(st.integers(1, 40)), draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    weight = _array(seed, (k, n))
    a = _array(seed + 1, (draw(st.integers(0, 4)), k))
    bias = _array(seed + 2, (n,)) if draw(st.booleans()) else None
    scratch = draw(st.sampled_from([4, 4 * n * block + 4, 4 << 20]))
    return a, weight, bias, block, scratch


@SETTINGS
@given(int4_cases())
def test_int4_blockwise_qmatmul_matches_dequantize_then_matmul(case):
    """Blocks along K, a shorter last block, several blocks per scratch fill or one."""
    a, weight, bias, block, scratch = case
    q, scale, zero = quant.quantize_int4(weight, block)
    attrs = {"axis": 0, "block_size": block, "packed": "uint4", "shape": list(weight.shape)}
    inputs = [a, quant.pack4(q), scale.astype(np.float32), quant.pack4(zero), bias]
    full = dequantize(inputs[1], inputs[2], inputs[3], attrs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", scratch)
        (got,) = qmatmul(inputs, attrs)
    _close(got, _reference(a, full, bias), a.shape[-1])


@SETTINGS
@given(st.integers(1, 50), st.integers(1, 20), st.integers(0, 2**32 - 1), st.sampled_from([8, 1 << 20]))
def test_uint8_per_column_with_zero_point_matches_reference(k, n, seed, scratch):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, (k, n)).astype(np.uint8)
    zero = rng.integers(0, 256, n).astype(np.uint8)
    scale = (rng.random(n) * 0.1 + 0.01).astype(np.float32)
    a = _array(seed, (2, 3, k))
    full = dequantize(q, scale, zero, {"axis": 1})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", scratch)
        (got,) = qmatmul([a, q, scale, zero], {"axis": 1})
    _close(got, _reference(a, full, None), k)


@pytest.mark.parametrize("activation", ["Gelu", "Relu"])
def test_int8_qmatmul_equals_onnx_reference_dequantize_matmul_add(activation):
    """The same computation as ONNX spells it, run by onnx's ReferenceEvaluator."""
    k, n = 96, 40
    weight, a, bias = _array(1, (k, n)), _array(2, (1, 3, k)), _array(3, (n,))
    q, scale = quant.quantize_int8(weight, 1)
    want = run_int8_matmul_reference(q, scale, a, bias, activation)
    attrs = {"axis": 1, "activation": activation, "activation_attrs": {}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", 4 * n * 10)  # 10 rows at a time
        (got,) = qmatmul([a, q, scale, None, bias], attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(
    st.integers(1, 70),
    st.integers(1, 40),
    st.sampled_from([(), (1,), (1, 1)]),
    st.integers(1, 9),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_int8_one_row_qmatmul_in_row_chunks_matches_onnx_reference(k, n, lead, chunk, with_bias, seed):
    """A decode step's single input row, the weight cast ``chunk`` rows at a time (the last
    chunk shorter, or one row at a time, or all of it at once)."""
    q, scale = quant.quantize_int8(_array(seed, (k, n)), 1)
    a = _array(seed + 1, (*lead, k))
    bias = _array(seed + 2, (n,)) if with_bias else None
    want = run_int8_matmul_reference(q, scale, a, bias)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", 4 * n * chunk)
        (got,) = qmatmul([a, q, scale, None, bias] if with_bias else [a, q, scale], {"axis": 1})
    assert got.shape == want.shape
    _close(got, want.astype(np.float64), k)


def test_scratch_is_reused_not_reallocated():
    weight, a = _array(4, (64, 32)), _array(5, (1, 64))
    q, scale = quant.quantize_int8(weight, 1)
    qmatmul([a, q, scale], {"axis": 1})
    buffer = quantized._rows_scratch(1, 1, np.dtype(np.float32)).__array_interface__["data"][0]
    for _ in range(3):
        (got,) = qmatmul([a, q, scale], {"axis": 1})
        assert quantized._rows_scratch(1, 1, np.dtype(np.float32)).__array_interface__["data"][0] == buffer
    _close(got, _reference(a, dequantize(q, scale, None, {"axis": 1}), None), 64)


def test_threads_do_not_share_a_scratch_buffer():
    """Sessions may run in parallel threads: each must cast into its own buffer."""
    weights = [quant.quantize_int8(_array(seed, (1000, 300)), 1) for seed in range(4)]
    a = _array(9, (2, 1000))
    want = [_reference(a, dequantize(q, s, None, {"axis": 1}), None) for q, s in weights]
    failures: list[str] = []

    def work(index: int) -> None:
        q, s = weights[index]
        for _ in range(30):
            (got,) = qmatmul([a, q, s], {"axis": 1})
            if not np.allclose(got, want[index], rtol=1e-4, atol=1e-3):
                failures.append(f"thread {index}")
                return

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantized, "SCRATCH_BYTES", 4 * 300 * 400)  # big casts: numpy lets go of the GIL
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []


@pytest.mark.parametrize(
    ("k", "n", "itemsize", "multiple", "budget", "rows"),
    [
        (512, 16384, 4, 1, 4 << 20, 64),  # a vocabulary projection: 64 rows of 16384 floats
        (512, 512, 4, 1, 4 << 20, 512),  # fits whole
        (100, 1 << 20, 4, 1, 4 << 20, 1),  # one row is over budget: still one row
        (200, 1000, 4, 32, 4 * 1000 * 40, 32),  # whole quantization blocks
        (200, 1000, 4, 32, 4, 32),
        (0, 10, 4, 1, 4 << 20, 1),
    ],
)
def test_block_rows(monkeypatch, k, n, itemsize, multiple, budget, rows):
    monkeypatch.setattr(quantized, "SCRATCH_BYTES", budget)
    assert block_rows(k, n, itemsize, multiple) == rows


@SETTINGS
@given(st.integers(1, 30), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_int8_qgather_matches_dequantized_rows(height, width, seed):
    table = _array(seed, (height, width))
    q, scale = quant.quantize_int8(table, 0)
    indices = np.random.default_rng(seed).integers(-height, height, (2, 3))
    (got,) = qgather([q, scale, None, indices], {"axis": 0})
    np.testing.assert_array_equal(got, dequantize(q, scale, None, {"axis": 0})[indices])


# -- loading: verify without making the weights resident -------------------------------------------


def _package(tmp_path: Path, megabytes: int = 0, size: int = 1000) -> Path:
    count = max(size, megabytes * (1 << 20) // 4)
    weights = {"w": np.random.default_rng(0).standard_normal(count).astype(np.float32)}
    path = tmp_path / "p.ferry"
    write_package(
        path,
        graph={"nodes": [], "inputs": [], "outputs": []},
        tensors=weights,
        inputs=[],
        outputs=[],
    )
    return path


@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
def test_chunked_hash_verifies_and_catches_a_flipped_byte(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(fmt, "HASH_CHUNK", chunk)
    path = _package(tmp_path, size=3001)
    package = fmt.read_package(path)
    assert package.tensors["w"].shape == (3001,)
    data = bytearray(path.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        member = tar.getmember(fmt.WEIGHTS)
    data[member.offset_data + member.size - 1] ^= 0x80  # the last byte: the end of the last chunk
    path.write_bytes(bytes(data))
    with pytest.raises(PackageIntegrityError, match="weights.bin does not match its sha256"):
        fmt.read_package(path)


def _rss_file_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    pytest.skip("no RssFile in /proc/self/status")


def test_verifying_a_package_does_not_map_its_weights_in(tmp_path):
    path = _package(tmp_path, megabytes=32)
    before = _rss_file_kb()
    package = fmt.read_package(path)
    grown = _rss_file_kb() - before
    assert grown < 8 * 1024, f"loading made {grown} KB of the 32 MB package resident"
    assert float(package.tensors["w"][-1]) == float(np.asarray(package.tensors["w"])[-1])


# -- the JIT tier's several-row int8 QMatMul (BLAS on the cast weights, JIT scale/bias/GELU) ---------


@settings(max_examples=30, deadline=None)
@given(
    st.integers(2, 40),  # rows
    st.integers(1, 70),  # k
    st.integers(1, 90),  # n
    st.sampled_from([None, "Gelu"]),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_int8_rows_qmatmul_jit_matches_numpy_and_the_reference(rows, k, n, activation, with_bias, seed):
    pytest.importorskip("numba")
    from engine import jit  # noqa: PLC0415 - only with the JIT tier

    if not jit.enabled():
        pytest.skip("the JIT tier is turned off (FERRY_JIT=0)")
    quantized_jit = jit.module("engine.ops.quantized_jit")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, rows, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    q, scale = quant.quantize_int8(w, axis=1)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    attrs = {"axis": 1, **({"activation": activation} if activation else {})}
    inputs = [a, q, scale] + ([None, bias] if with_bias else [])
    want = run_int8_matmul_reference(q, scale, a, bias, activation)
    numpy_result = qmatmul(inputs, attrs)[0]
    got = quantized_jit.qmatmul_rows_jit(inputs, attrs)[0]
    assert got.shape == want.shape == (1, rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, numpy_result, rtol=1e-5, atol=1e-5)
    with jit.thread_limit(2):
        np.testing.assert_array_equal(quantized_jit.qmatmul_rows_jit(inputs, attrs)[0], got)


def test_int8_rows_qmatmul_jit_falls_back_where_it_does_not_apply():
    """Other activations, zero points, block scales and one row go to the numpy kernel (or the GEMV)."""
    pytest.importorskip("numba")
    from engine import jit, kernels  # noqa: PLC0415

    if not jit.enabled():
        pytest.skip("the JIT tier is turned off (FERRY_JIT=0)")
    quantized_jit = jit.module("engine.ops.quantized_jit")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 8)).astype(np.float32)
    q, scale = quant.quantize_int8(rng.standard_normal((8, 5)).astype(np.float32), axis=1)
    for attrs, inputs in [
        ({"axis": 1, "activation": "Relu"}, [a, q, scale]),
        ({"axis": 1}, [a, q, scale, np.full(5, 3, np.int8)]),
    ]:
        np.testing.assert_array_equal(
            quantized_jit.qmatmul_rows_jit(inputs, attrs)[0], qmatmul(inputs, attrs)[0]
        )
    offered = kernels.jit_candidates("QMatMul", {"axis": 1}, [(3, 8), (8, 5), (5,)])
    assert quantized_jit.qmatmul_rows_jit in offered and quantized_jit.qmatmul_gemv_jit not in offered
    assert kernels.jit_candidates("QMatMul", {"axis": 1}, [(1, 8), (8, 5), (5,)]) == [
        quantized_jit.qmatmul_gemv_jit
    ]


# -- the JIT tier's one-row int8 QMatMul on its packed weights (pack_gemv) -------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 70),  # k: not only multiples of the kernel's four rows per pass
    st.integers(1, 600),  # n: one, several and a part of the 256-column blocks
    st.sampled_from([None, "Relu"]),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_int8_gemv_on_packed_weights_gives_the_same_bits(k, n, activation, with_bias, seed):
    pytest.importorskip("numba")
    from engine import jit  # noqa: PLC0415 - only with the JIT tier

    if not jit.enabled():
        pytest.skip("the JIT tier is turned off (FERRY_JIT=0)")
    quantized_jit = jit.module("engine.ops.quantized_jit")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, 1, k)).astype(np.float32)
    q, scale = quant.quantize_int8(rng.standard_normal((k, n)).astype(np.float32), axis=1)
    q[0, 0], q[-1, -1] = 127, -127  # the int8 form's extremes
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    attrs = {"axis": 1, **({"activation": activation} if activation else {})}
    inputs = [a, q, scale] + ([None, bias] if with_bias else [])
    [packed] = quantized_jit.pack_gemv(inputs, attrs).values()
    assert packed.shape == (-(-n // quantized_jit.BLOCK), k, quantized_jit.BLOCK)
    plain = quantized_jit.qmatmul_gemv_jit(inputs, attrs)[0]
    got = quantized_jit.qmatmul_gemv_jit([a, packed, *inputs[2:]], attrs)[0]
    np.testing.assert_array_equal(got, plain)
    want = run_int8_matmul_reference(q, scale, a, bias, activation)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with jit.thread_limit(2):
        np.testing.assert_array_equal(quantized_jit.qmatmul_gemv_jit([a, packed, *inputs[2:]], attrs)[0], got)


def test_packed_int8_gemv_weights_still_serve_operands_it_does_not_take():
    """Packing happens for the plan's operands; weights packed and then met with several rows
    (or with other operands) are unpacked for the numpy kernel, not misread."""
    pytest.importorskip("numba")
    from engine import jit  # noqa: PLC0415

    if not jit.enabled():
        pytest.skip("the JIT tier is turned off (FERRY_JIT=0)")
    quantized_jit = jit.module("engine.ops.quantized_jit")
    rng = np.random.default_rng(3)
    q, scale = quant.quantize_int8(rng.standard_normal((12, 300)).astype(np.float32), axis=1)
    one = rng.standard_normal((1, 12)).astype(np.float32)
    [packed] = quantized_jit.pack_gemv([one, q, scale], {"axis": 1}).values()
    rows = rng.standard_normal((3, 12)).astype(np.float32)
    np.testing.assert_array_equal(
        quantized_jit.qmatmul_gemv_jit([rows, packed, scale], {"axis": 1})[0],
        qmatmul([rows, q, scale], {"axis": 1})[0],
    )
    assert quantized_jit.pack_gemv([rows, q, scale], {"axis": 1}) == {}  # several rows: not packed
    assert quantized_jit.pack_gemv([one, q, scale, np.zeros(300, np.int8)], {"axis": 1}) == {}
