"""int_dot_ir.dot's code paths, each compiled on its own: 16 int32 lanes += the 4 products of a
lane's unsigned and signed bytes, exactly (numpy's int64 sums), at the extremes of both sides
(0/255 x -128/127) and on random bytes; and which path a CPU gets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

numba = pytest.importorskip("numba")
from numba import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from engine import jit  # noqa: E402
from engine.ops import int_dot_ir  # noqa: E402

pytestmark = pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
PATHS = {"generic": int_dot_ir._dot_generic, "avx2": int_dot_ir._dot_avx2, "vnni": int_dot_ir._dot_vnni}
RUNS_HERE = {"generic": lambda: True, "avx2": int_dot_ir.has_avx2, "vnni": jit.has_vnni}


def _kernel(dot):  # noqa: ANN001, ANN202
    """out[16] = acc[16] + dot(u[64] as 16 x 4 bytes, s[64]), with ``dot`` one of the paths."""

    @intrinsic
    def step(typingctx, acc, u, s, out):  # noqa: ANN001, ANN202, ARG001
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            kinds, zero = signature.args, numba.core.cgutils.intp_t(0)

            def load(i):  # noqa: ANN001, ANN202
                pointer = int_dot_ir.pointer(context, builder, kinds[i], args[i], zero, int_dot_ir.SUMS)
                return builder.load(pointer, align=1)

            target = int_dot_ir.pointer(context, builder, kinds[3], args[3], zero, int_dot_ir.SUMS)
            builder.store(dot(builder, load(0), load(1), load(2)), target, align=1)
            return context.get_dummy_value()

        return types.void(acc, u, s, out), codegen

    @numba.njit
    def run(acc, u, s, out):  # noqa: ANN001, ANN202
        step(acc, u, s, out)

    return run


_KERNELS: dict[str, object] = {}


def _dot(path: str, acc: np.ndarray, u: np.ndarray, s: np.ndarray) -> np.ndarray:
    if not RUNS_HERE[path]():
        pytest.skip(f"this CPU (as numba compiles for it) cannot run the {path} path")
    if path not in _KERNELS:
        _KERNELS[path] = _kernel(PATHS[path])
    out = np.empty(16, np.int32)
    _KERNELS[path](acc, u, s, out)
    return out


def _expected(acc: np.ndarray, u: np.ndarray, s: np.ndarray) -> np.ndarray:
    products = u.astype(np.int64).reshape(16, 4) * s.astype(np.int64).reshape(16, 4)
    return (acc.astype(np.int64) + products.sum(axis=1)).astype(np.int32)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("u_value", [0, 1, 127, 128, 255])
@pytest.mark.parametrize("s_value", [-128, -127, -1, 0, 1, 127])
def test_every_path_is_exact_at_the_extremes(path: str, u_value: int, s_value: int) -> None:
    u, s = np.full(64, u_value, np.uint8), np.full(64, s_value, np.int8)
    acc = np.arange(-8, 8, dtype=np.int32) * 1_000_003
    got = _dot(path, acc, u, s)
    np.testing.assert_array_equal(got, _expected(acc, u, s))
    assert got[0] - acc[0] == 4 * u_value * s_value


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_keeps_each_lane_to_its_own_bytes(path: str) -> None:
    """255 x -128 in one byte of one lane at a time, zeros elsewhere: nothing leaks across
    bytes, words or the two 256-bit halves."""
    acc = np.zeros(16, np.int32)
    for byte in range(64):
        u, s = np.zeros(64, np.uint8), np.zeros(64, np.int8)
        u[byte], s[byte] = 255, -128
        expected = np.zeros(16, np.int32)
        expected[byte // 4] = -32640
        np.testing.assert_array_equal(_dot(path, acc, u, s), expected)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PATHS)), st.integers(0, 2**31))
def test_every_path_gives_numpys_sums(path: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 256, 64, dtype=np.uint8)
    s = rng.integers(-128, 128, 64, dtype=np.int8)
    acc = rng.integers(-(2**30), 2**30, 16, dtype=np.int32)
    np.testing.assert_array_equal(_dot(path, acc, u, s), _expected(acc, u, s))


def test_the_path_follows_the_cpu_numba_compiles_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from numba.core import config  # noqa: PLC0415

    monkeypatch.setattr(config, "CPU_NAME", "haswell")
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx,+avx2,+fma")
    assert int_dot_ir.has_avx2() and not jit.has_vnni()
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx,+sse4.2")
    assert not int_dot_ir.has_avx2()
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    monkeypatch.setattr(config, "CPU_NAME", "generic")
    assert not int_dot_ir.has_avx2() and not jit.has_vnni()
    assert int_dot_ir.PATH in ("vnni", "avx2", "generic")


# -- AVX2's bounded forms: int4 nibbles (dot_small) and signed x signed bytes (dot_signed) --------


def _bounded_kernel(form: str):  # noqa: ANN202
    """out[16] = acc + form(u [pairs, 64], s [pairs, 64]): dot_small over all pairs, or
    dot_signed of the first pair."""

    @intrinsic
    def step(typingctx, acc, u, s, pairs, out):  # noqa: ANN001, ANN202, ARG001
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            kinds = signature.args

            def load(i: int, at: int):  # noqa: ANN202
                offset = numba.core.cgutils.intp_t(at)
                return builder.load(
                    int_dot_ir.pointer(context, builder, kinds[i], args[i], offset, int_dot_ir.SUMS), align=1
                )

            total = load(0, 0)
            if form == "small":
                operands = [(load(1, 64 * p), load(2, 64 * p)) for p in range(int_dot_ir.SMALL_PAIRS)]
                total = int_dot_ir.dot_small(builder, total, operands)
            else:
                total = int_dot_ir.dot_signed(builder, total, load(1, 0), load(2, 0))
            target = int_dot_ir.pointer(
                context, builder, kinds[4], args[4], numba.core.cgutils.intp_t(0), int_dot_ir.SUMS
            )
            builder.store(total, target, align=1)
            return context.get_dummy_value()

        return types.void(acc, u, s, pairs, out), codegen

    @numba.njit
    def run(acc, u, s, out):  # noqa: ANN001, ANN202
        step(acc, u, s, 0, out)

    return run


def _bounded(form: str, acc: np.ndarray, u: np.ndarray, s: np.ndarray) -> np.ndarray:
    if not int_dot_ir.has_avx2() or not int_dot_ir.AVX2:
        pytest.skip("the bounded forms' AVX2 code needs AVX2 (as numba compiles for this CPU)")
    key = f"bounded-{form}"
    if key not in _KERNELS:
        _KERNELS[key] = _bounded_kernel(form)
    out = np.empty(16, np.int32)
    _KERNELS[key](acc, u.reshape(-1), s.reshape(-1), out)
    return out


def _expected_pairs(acc: np.ndarray, u: np.ndarray, s: np.ndarray) -> np.ndarray:
    products = u.astype(np.int64).reshape(-1, 16, 4) * s.astype(np.int64).reshape(-1, 16, 4)
    return (acc.astype(np.int64) + products.sum(axis=(0, 2))).astype(np.int32)


@pytest.mark.parametrize(("u_value", "s_value"), [(15, -128), (15, 127), (0, -128), (15, 0), (1, -1)])
def test_nibble_sums_in_sixteen_bits_are_exact_at_their_bound(u_value: int, s_value: int) -> None:
    u = np.full((int_dot_ir.SMALL_PAIRS, 64), u_value, np.uint8)
    s = np.full((int_dot_ir.SMALL_PAIRS, 64), s_value, np.int8)
    acc = np.arange(16, dtype=np.int32) - 5
    got = _bounded("small", acc, u, s)
    np.testing.assert_array_equal(got, _expected_pairs(acc, u, s))
    assert got[0] - acc[0] == 8 * 4 * u_value * s_value


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_nibble_sums_give_numpys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 16, (int_dot_ir.SMALL_PAIRS, 64), dtype=np.uint8)
    s = rng.integers(-128, 128, (int_dot_ir.SMALL_PAIRS, 64), dtype=np.int8)
    acc = rng.integers(-(2**30), 2**30, 16, dtype=np.int32)
    np.testing.assert_array_equal(_bounded("small", acc, u, s), _expected_pairs(acc, u, s))


@pytest.mark.parametrize("a_value", [-128, -127, -1, 0, 1, 127])
@pytest.mark.parametrize("b_value", [-127, -1, 0, 1, 127])
def test_signed_products_are_exact_at_their_bounds(a_value: int, b_value: int) -> None:
    a = np.full((1, 64), a_value, np.int8)
    b = np.full((1, 64), b_value, np.int8)
    acc = np.full(16, 7, np.int32)
    got = _bounded("signed", acc, a, b)
    np.testing.assert_array_equal(got, _expected_pairs(acc, a, b))
    assert got[0] == 7 + 4 * a_value * b_value


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_signed_products_give_numpys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (1, 64), dtype=np.int8)
    b = rng.integers(-127, 128, (1, 64), dtype=np.int8)
    acc = rng.integers(-(2**30), 2**30, 16, dtype=np.int32)
    np.testing.assert_array_equal(_bounded("signed", acc, a, b), _expected_pairs(acc, a, b))
