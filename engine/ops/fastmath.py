"""Exponentials and the exact GELU in whichever form is fastest on this machine.

numpy's float32 transcendentals take different SIMD paths per CPU: on an AVX-512 machine
``np.exp2`` took half the time of ``np.exp``; on an AVX2-only one (numpy's X86_V3) 1.5x as
long, each there as slow as 12-20 simple passes over the data (they run scalar).  So the
forms below are measured against each other once per process, at first use, on a cache-sized
sample, and the faster is kept: a machine-level choice, like the kernel search's per-node one.
The GELU forms agree with the erf formula to ~6e-7 absolute, and 2^x as exp(x ln 2) to ~3e-6
relative at |x| = 64: a choice moves results by that much at most.  Where results must not
depend on what a process measured (the self-test outputs the converter writes into a
package), ``fixed_forms()`` pins the forms the engine used before any were measured.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

LN_2 = math.log(2)
SAMPLE = 1 << 16  # elements measured per form: 256 KB of float32, cache-resident like a layer's output
ROUNDS = 5


def exp2(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """2 ** x, as ``np.exp2`` or as ``np.exp(x * ln 2)``, whichever is faster here for x's dtype."""
    if x.dtype != np.float32 or not _use_natural_exp():
        return np.exp2(x, out=out)
    return _exp2_natural(x, out)


def _exp2_natural(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    scaled = np.multiply(x, np.float32(LN_2), out=out)
    if not isinstance(scaled, np.ndarray):  # a 0-d input without out: numpy returned a scalar
        return np.exp(scaled)
    return np.exp(scaled, out=scaled)


_pinned = threading.local()  # per thread: a pinned block on one thread leaves others measured


@contextlib.contextmanager
def forced_forms(natural_exp: bool, table_gelu: bool) -> Iterator[None]:
    """Within the block, on this thread, use these forms whatever was measured: 2^x as
    exp(x ln 2) or np.exp2, and float32 GELU by table or by polynomial (with that exponential).
    For comparing forms on one machine (bench/engine_breakdown.py, tests)."""
    previous = getattr(_pinned, "forms", None)
    _pinned.forms = (natural_exp, table_gelu)
    try:
        yield
    finally:
        _pinned.forms = previous


def fixed_forms() -> contextlib.AbstractContextManager[None]:
    """Within the block, on this thread, use np.exp2 and the np.exp2 GELU polynomial whatever
    was measured, so results do not depend on what this process measured (for what is stored,
    such as a package's self-test outputs; the BLAS may still round differently elsewhere)."""
    return forced_forms(natural_exp=False, table_gelu=False)


def _use_natural_exp() -> bool:
    forms = getattr(_pinned, "forms", None)
    return forms[0] if forms is not None else _natural_exp_faster()


def _use_table_gelu() -> bool:
    forms = getattr(_pinned, "forms", None)
    return forms[1] if forms is not None else _table_gelu_faster()


# gelu(x) = x * Phi(x) = x / (1 + exp(u)) with u = -logit(Phi(x)), an odd function of x, fitted
# as -x * P(x^2) with P of degree 6 (weighted by how much an error in u moves gelu): |error| <
# 7e-8 in exact arithmetic, ~6e-7 absolute evaluated in float32.  17 numpy passes.
_LOGIT_PHI = (
    1.5957684324660537,
    0.07266856622987218,
    -6.625937543511903e-05,
    -0.00011048050066814808,
    7.938243948267043e-06,
    -2.6689435636969214e-07,
    3.611267059697654e-09,
)
_EXP_COEFFS = tuple(-c for c in _LOGIT_PHI)  # exp(-u)
_EXP2_COEFFS = tuple(-c * math.log2(math.e) for c in _LOGIT_PHI)  # exp(-u) = exp2(-u * log2(e))


def gelu_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU of a float array into ``out`` (which may be ``x``), in x's precision.

    Infinities and NaN give what 0.5 * x * (1 + erf(x / sqrt2)) gives (gelu(-inf) is NaN).
    Narrower floats are computed in float32: in float16 the polynomial's top coefficients
    underflow and it changes sign (gelu(6) would be 0).
    """
    if x.dtype.itemsize < 4:
        np.copyto(out, gelu_into(x.astype(np.float32), np.empty(x.shape, np.float32)), casting="unsafe")
        return out
    if x.ndim == 0:  # numpy hands 0-d results back as scalars, which cannot be written into
        gelu_into(x.reshape(1), out.reshape(1))
        return out
    if x.dtype == np.float32 and _use_table_gelu():
        return gelu_table_into(x, out)
    return gelu_polynomial_into(x, out, natural=x.dtype == np.float32 and _use_natural_exp())


def gelu_polynomial_into(x: np.ndarray, out: np.ndarray, natural: bool = False) -> np.ndarray:
    """GELU as x / (1 + exp(-x P(x^2))), with ``np.exp`` (``natural``) or ``np.exp2``.

    The top coefficient is positive, so beyond the fitted range the exponent keeps the right
    sign and grows: exp overflows to inf for very negative x (x / inf = -0, the right limit)
    and tends to 0 for large positive x (gelu = x).
    """
    t = x.dtype.type
    coeffs = _EXP_COEFFS if natural else _EXP2_COEFFS
    with np.errstate(over="ignore", invalid="ignore"):  # the limits above; -inf / inf is NaN
        s = np.square(x)
        p = np.multiply(s, t(coeffs[6]))
        p += t(coeffs[5])
        for c in reversed(coeffs[:5]):
            p *= s
            p += t(c)
        p *= x
        (np.exp if natural else np.exp2)(p, out=p)
        p += t(1)
        return np.divide(x, p, out=out)


# Phi by first-order Taylor steps from a table: nodes every 2^-10 on [-6, 6], Phi(x_i) and
# h * phi(x_i).  |x| * (f h)^2 / 2 * max|Phi''| bounds gelu's error by 2.6e-8; x is clipped to
# the table (Phi(-6) = 1e-9, stored as 0 so that gelu(-inf) is NaN and gelu(x < -6) is 0).
_STEPS_PER_UNIT = 1024
_TABLE_HALF_WIDTH = 6
_CENTRE = _STEPS_PER_UNIT * _TABLE_HALF_WIDTH  # the node of x = 0
# Adding 1.5 * 2^23 (+ the centre) rounds a float32 step count to an integer held in the low mantissa
# bits (float32 spacing is 1 there): those bits are the table index, read without a float to
# int conversion pass.  Masking keeps any input (NaN too) inside the padded table.
_ROUNDER = np.float32(1.5 * 2**23 + _CENTRE)
_INDEX_MASK = (1 << 14) - 1


@functools.cache
def _phi_table() -> tuple[np.ndarray, np.ndarray]:
    nodes = (np.arange(2 * _CENTRE + 1) - _CENTRE) / _STEPS_PER_UNIT
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in nodes.tolist()])
    phi[0] = 0.0
    slope = np.exp(-0.5 * nodes**2) / math.sqrt(2 * math.pi) / _STEPS_PER_UNIT
    padded = [np.zeros(_INDEX_MASK + 1, np.float32) for _ in range(2)]
    padded[0][: phi.size], padded[1][: slope.size] = phi, slope
    return padded[0], padded[1]


def gelu_table_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """GELU of a float32 array as x * Phi(x), Phi from the table above: 11 passes, two of them
    gathers (the index trick reads float32 bits, so float32 only)."""
    if x.dtype != np.float32 or x.ndim == 0:
        raise TypeError(f"gelu_table_into takes float32 arrays of rank >= 1, not {x.dtype} of rank {x.ndim}")
    values, slopes = _phi_table()
    # invalid: -inf * 0 is NaN, as the erf formula gives; a signalling NaN input stays NaN
    with np.errstate(invalid="ignore"):
        steps = np.clip(x, np.float32(-_TABLE_HALF_WIDTH), np.float32(_TABLE_HALF_WIDTH))
        steps *= np.float32(_STEPS_PER_UNIT)
        rounded = np.add(steps, _ROUNDER)
        node = np.subtract(rounded, _ROUNDER)  # the nearest node, in steps from x = 0
        steps -= node  # the fraction of a step from that node, in [-0.5, 0.5]
        bits = rounded.view(np.int32)
        bits &= _INDEX_MASK  # in int32, then widened: twice as fast as one widening bitwise_and
        index = bits.astype(np.intp)
        steps *= np.take(slopes, index, out=rounded, mode="wrap")  # in range: numpy's fastest mode
        steps += np.take(values, index, out=node, mode="wrap")
        return np.multiply(x, steps, out=out)


def chosen_forms() -> dict[str, str]:
    """Which form of each function this process uses (measuring them now if not done yet)."""
    gelu = "table" if _table_gelu_faster() else f"polynomial, {'exp' if _natural_exp_faster() else 'exp2'}"
    return {"exp2": "exp(x ln 2)" if _natural_exp_faster() else "exp2", "gelu": gelu}


# The measured choices, made once per process.  A lock, so two threads' first runs neither
# measure at once (each would slow the other's timings) nor keep different answers.
_CHOICES: dict[str, bool] = {}
_MEASURING = threading.RLock()  # re-entrant: the GELU measurement asks for the exp choice


def _natural_exp_faster() -> bool:
    return _choice("natural_exp", _measure_natural_exp)


def _table_gelu_faster() -> bool:
    return _choice("table_gelu", _measure_table_gelu)


def _choice(name: str, measure: Callable[[], bool]) -> bool:
    if name not in _CHOICES:
        with _MEASURING:
            if name not in _CHOICES:
                _CHOICES[name] = measure()
    return _CHOICES[name]


def _measure_natural_exp() -> bool:
    x, out = _sample(), np.empty(SAMPLE, np.float32)
    return _fastest([lambda: _exp2_natural(x, out), lambda: np.exp2(x, out=out)]) == 0


def _measure_table_gelu() -> bool:
    x, out = _sample(), np.empty(SAMPLE, np.float32)
    natural = _natural_exp_faster()
    forms = [lambda: gelu_table_into(x, out), lambda: gelu_polynomial_into(x, out, natural)]
    return _fastest(forms) == 0


def _sample() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(SAMPLE).astype(np.float32)


def _fastest(forms: list[Callable[[], object]]) -> int:
    """The index of the form with the lowest best time over ROUNDS interleaved rounds."""
    for form in forms:  # warm-up: caches, and the table built
        form()
    best = [math.inf] * len(forms)
    for _ in range(ROUNDS):
        for i, form in enumerate(forms):
            start = time.perf_counter()
            form()
            best[i] = min(best[i], time.perf_counter() - start)
    return best.index(min(best))
