"""Row-wise GELU as a JIT kernel (numba), alone or as FusedMatMul's bias + GELU epilogue: the
twin of fastmath.py's GELU forms.

numpy's fastest exact GELU here is fastmath.py's table form: 11 whole-array passes, two of them
gathers; this is two passes per row while it sits in L1, bias included, and both vectorise.  It
is fastmath's polynomial form, gelu(x) = x / (1 + 2^(x Q(x^2))), with 2^t as exp_jit's
polynomial (its exponent bits written in the first pass, multiplied in the second: numba has
no scalar bit cast).  An earlier JIT kernel read fastmath's Phi table (a gather per element,
which does not vectorise): 1.3x this one's time at ViT's 197x768.  It agrees with the erf
formula to ~8e-7 absolute; infinities and NaN give what the formula gives (gelu(-inf) is NaN);
no fastmath but FMA contraction (exp_jit.CONTRACT).

LayerNormalization over the last axis is a JIT kernel too: three passes per row (sum, centred
squares, the affine store) in one call, ~11 us at ViT's 197x192 and BERT's 128x384 against
numpy's ~60 (four L1-resident passes, but a dozen numpy calls) and onnxruntime's ~30 (same run).
An earlier JIT LayerNorm measured within noise of numpy: its sums were one serial chain.  Here
the row sums carry LLVM's ``reassoc`` flag (and only they: it lets the vectoriser keep 16 partial
sums, as numpy's pairwise sum keeps several; no worse rounded), and the variance is the two-pass
one (mean subtracted first), so rows far from zero keep their digits.  The softmax inside
attention is a JIT kernel (attention_jit.py) since exp_jit's 2^x replaced numba's scalar exp.

Every kernel here compiles with error_model="numpy": numba's default checks each float divide
for zero (to raise ZeroDivisionError), a branch that kept GELU's divide from vectorising.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit, team
from engine.ops import exp_jit, fastmath
from engine.ops.common import normalize_axis
from engine.ops.fused import apply_activation, fused_matmul
from engine.ops.geglu import fused_geglu, halves
from engine.ops.normalization import DEFAULT_EPSILON, layer_normalization
from engine.ops.registry import REGISTRY, Kernel

_F32 = types.float32
_ROWS = jit.array(_F32, 2, "C")
# C, not A: with unknown strides LLVM does not vectorise the loop reading the bias (5x slower)
_VECTOR_IN = jit.array(_F32, 1, "C", readonly=True)
_ROW = jit.array(_F32, 1, "C")
_BITS = jit.array(types.int32, 1, "C")
_GELU = types.void(_ROWS, _VECTOR_IN, types.int64, types.int64)  # rows [first, last)
# the exponent of 2 in gelu(x) = x / (1 + 2^(x Q(x^2))): fastmath's fit, in powers of x^2
_Q0, _Q1, _Q2, _Q3, _Q4, _Q5, _Q6 = (float(c) for c in fastmath._EXP2_COEFFS)
_E0, _E1, _E2, _E3, _E4, _E5, _E6 = (
    exp_jit._C0,
    exp_jit._C1,
    exp_jit._C2,
    exp_jit._C3,
    exp_jit._C4,
    exp_jit._C5,
    exp_jit._C6,
)
_ROUNDER = exp_jit._ROUNDER


@jit.njit([types.void(_ROW, _VECTOR_IN, _ROW, _BITS)], error_model="numpy", fastmath=exp_jit.CONTRACT)
def _gelu_row(row, bias, mantissa, bits):  # noqa: ANN001, ANN202
    """row = gelu(row + bias) in place; ``mantissa`` and ``bits`` are scratch rows."""
    n = row.shape[0]
    for k in range(n):
        v = row[k] + bias[k]
        row[k] = v
        s = v * v
        q = np.float32(_Q6) * s + np.float32(_Q5)
        q = q * s + np.float32(_Q4)
        q = q * s + np.float32(_Q3)
        q = q * s + np.float32(_Q2)
        q = q * s + np.float32(_Q1)
        q = q * s + np.float32(_Q0)
        # 2^t as exp_jit.exp2_row computes it; t = +-inf (x = -+inf) gives 2^t = inf / 0
        t = min(max(q * v, np.float32(exp_jit.LOW)), np.float32(exp_jit.HIGH))
        r = (t + np.float32(_ROUNDER)) - np.float32(_ROUNDER)
        f = t - r
        e = np.float32(_E6) * f + np.float32(_E5)
        e = e * f + np.float32(_E4)
        e = e * f + np.float32(_E3)
        e = e * f + np.float32(_E2)
        e = e * f + np.float32(_E1)
        mantissa[k] = e * f + np.float32(_E0)
        bits[k] = (np.int32(r) + np.int32(127)) << 23
    powers = bits[:n].view(np.float32)
    for k in range(n):
        row[k] = row[k] / (np.float32(1) + mantissa[k] * powers[k])


@jit.njit([_GELU], error_model="numpy")
def _gelu_rows(y, bias, first, last):  # noqa: ANN001, ANN202
    """y[r] = gelu(y[r] + bias) for r in [first, last): called for all rows (one thread), per
    chunk by ``_gelu_parallel``, or per claimed chunk by team_jit's worker."""
    mantissa, bits = np.empty(y.shape[1], np.float32), np.empty(y.shape[1], np.int32)
    for r in range(first, last):
        _gelu_row(y[r], bias, mantissa, bits)


@jit.njit([_GELU], parallel=True, error_model="numpy")
def _gelu_parallel(y, bias, first, last):  # noqa: ANN001, ANN202
    chunks = 8
    per = (last - first + chunks - 1) // chunks
    for c in prange(chunks):
        start = min(last, first + c * per)
        _gelu_rows(y, bias, start, min(last, start + per))


@functools.lru_cache(maxsize=32)
def _zeros(n: int) -> np.ndarray:
    """A read-only vector of n zeros: the bias of a GELU without one (no branch in the loop)."""
    zeros = np.zeros(n, np.float32)
    zeros.flags.writeable = False
    return zeros


def gelu_rows_into(y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """y = gelu(y + bias) in place, for a C-contiguous float32 y (bias over its last axis); shared
    by rows with engine/team.py's worker during a team run, from team.MIN_ROW_ELEMENTS."""
    rows = y.reshape(-1, y.shape[-1])
    bias = _zeros(rows.shape[1]) if bias is None else np.ascontiguousarray(bias)
    args = (rows, bias, 0, rows.shape[0])
    if team.active() is not None and rows.size >= team.MIN_ROW_ELEMENTS and rows.shape[0] > 1:
        team.run(team.GELU, _gelu_rows, _gelu_parallel, *args)
    else:
        jit.run(_gelu_rows, _gelu_parallel, *args)
    return y


def exact_gelu(attrs: dict[str, Any]) -> bool:
    """Whether a fused activation's GELU is the exact (erf) one this module computes."""
    return (attrs.get("activation_attrs") or {}).get("approximate", "none") == "none"


def fused_matmul_gelu_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedMatMul with an exact GELU: the BLAS product, then bias and GELU in one JIT pass."""
    a, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    plain = a.dtype == w.dtype == np.float32 and w.ndim == 2 and a.ndim >= 1
    if not (plain and attrs.get("activation") == "Gelu" and exact_gelu(attrs)):
        return fused_matmul(inputs, attrs)
    if bias is not None and (bias.shape != (w.shape[1],) or bias.dtype != np.float32):
        return fused_matmul(inputs, attrs)
    y = np.dot(a.reshape(-1), w) if a.size == a.shape[-1] else np.matmul(a, w)
    if y.size == 0 or not y.flags.c_contiguous:
        return [
            apply_activation(y + bias if bias is not None else y, attrs).reshape((*a.shape[:-1], w.shape[1]))
        ]
    return [gelu_rows_into(y, bias).reshape((*a.shape[:-1], w.shape[1]))]


def gelu_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Gelu (opset 20, exact) of float32 input."""
    x = inputs[0]
    if x.dtype != np.float32 or x.ndim == 0 or x.size == 0 or attrs.get("approximate", "none") != "none":
        return REGISTRY["Gelu"](inputs, attrs)
    return [gelu_rows_into(np.array(x, np.float32, order="C"), None)]


# -- GEGLU (FusedGeglu: value * gelu(gate), the halves of each row) ----------------------------

_GEGLU = types.void(jit.array(_F32, 2, "C", readonly=True), _ROWS)


@jit.njit([types.void(_VECTOR_IN, _VECTOR_IN, _ROW, _VECTOR_IN, _ROW, _BITS)], error_model="numpy")
def _geglu_row(value, gate, out, zeros, mantissa, bits):  # noqa: ANN001, ANN202
    """out = value * gelu(gate) for one row, in L1: the gate copied in, GELU in place, then the
    product (the numpy kernel's order: gelu first, then times the value)."""
    for k in range(out.shape[0]):
        out[k] = gate[k]
    _gelu_row(out, zeros, mantissa, bits)
    for k in range(out.shape[0]):
        out[k] = value[k] * out[k]


@jit.njit([_GEGLU], error_model="numpy")
def _geglu_serial(x, out):  # noqa: ANN001, ANN202
    half = out.shape[1]
    mantissa, bits = np.empty(half, np.float32), np.empty(half, np.int32)
    zeros = np.zeros(half, np.float32)
    for r in range(out.shape[0]):
        _geglu_row(x[r, :half], x[r, half : 2 * half], out[r], zeros, mantissa, bits)


@jit.njit([_GEGLU], parallel=True, error_model="numpy")
def _geglu_parallel(x, out):  # noqa: ANN001, ANN202
    half, chunks = out.shape[1], 8
    per = (out.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        mantissa, bits = np.empty(half, np.float32), np.empty(half, np.int32)
        zeros = np.zeros(half, np.float32)
        for r in range(c * per, min((c + 1) * per, out.shape[0])):
            _geglu_row(x[r, :half], x[r, half : 2 * half], out[r], zeros, mantissa, bits)


def geglu_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedGeglu (exact GELU) of float32 input, C-contiguous (a projection's output)."""
    x = inputs[0]
    value, _ = halves(x, attrs)  # checks the width
    plain = x.dtype == np.float32 and x.size > 0 and attrs.get("approximate", "none") == "none"
    if not plain or not x.flags.c_contiguous:
        return fused_geglu(inputs, attrs)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty((rows.shape[0], value.shape[-1]), np.float32)
    jit.run(_geglu_serial, _geglu_parallel, rows, out)
    return [out.reshape(value.shape)]


# -- LayerNormalization ----------------------------------------------------------------------

_ROWS_IN = jit.array(_F32, 2, "C", readonly=True)
_ROWS_OUT = jit.array(_F32, 2, "C")
_VECTOR = jit.array(_F32, 1, "C")
# x [R, N], scale [N], bias [N], epsilon, out [R, N], mean [R], inv_std [R]
_LAYER_NORM = types.void(_ROWS_IN, _VECTOR_IN, _VECTOR_IN, _F32, _ROWS_OUT, _VECTOR, _VECTOR)


_SUMS = {"reassoc", "contract"}  # the row sums' flags: 16 partial sums instead of one chain


@jit.njit([_F32(_VECTOR_IN)], error_model="numpy", fastmath=_SUMS)
def _sum(row):  # noqa: ANN001, ANN202
    total = np.float32(0)
    for k in range(row.shape[0]):
        total += row[k]
    return total


@jit.njit([_F32(_VECTOR_IN, _F32)], error_model="numpy", fastmath=_SUMS)
def _centred_squares(row, mean):  # noqa: ANN001, ANN202
    total = np.float32(0)
    for k in range(row.shape[0]):
        d = row[k] - mean
        total += d * d
    return total


@jit.njit([_LAYER_NORM], error_model="numpy", fastmath=exp_jit.CONTRACT)
def _layer_norm(x, scale, bias, epsilon, out, means, inv_stds):  # noqa: ANN001, ANN202
    size = np.float32(x.shape[1])
    for r in range(x.shape[0]):
        row = x[r]
        mean = _sum(row) / size
        inv_std = np.float32(1) / np.sqrt(_centred_squares(row, mean) / size + epsilon)
        means[r], inv_stds[r] = mean, inv_std
        y = out[r]
        for k in range(x.shape[1]):
            y[k] = (row[k] - mean) * inv_std * scale[k] + bias[k]


def _plain(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> bool:
    n = x.shape[-1] if x.ndim else 0
    return (
        x.dtype == np.float32
        and n > 0
        and x.size > 0
        and normalize_axis(int(attrs.get("axis", -1)), x.ndim) == x.ndim - 1
        and scale.shape == (n,)
        and scale.dtype == np.float32
        and (bias is None or (bias.shape == (n,) and bias.dtype == np.float32))
    )


def layer_norm_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """LayerNormalization of float32 rows over the last axis (anything else: the numpy kernel)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if not _plain(x, scale, bias, attrs):
        return layer_normalization(inputs, attrs)
    n = x.shape[-1]
    rows = np.ascontiguousarray(x).reshape(-1, n)
    scale = np.ascontiguousarray(scale)  # a packed stride-0 vector (pack_layer_norm) is not C
    bias = _zeros(n) if bias is None else np.ascontiguousarray(bias)
    out = np.empty(rows.shape, np.float32)
    means, inv_stds = np.empty(rows.shape[0], np.float32), np.empty(rows.shape[0], np.float32)
    epsilon = np.float32(attrs.get("epsilon", DEFAULT_EPSILON))
    _layer_norm(rows, scale, bias, epsilon, out, means, inv_stds)
    stats = (*x.shape[:-1], 1)
    return [out.reshape(x.shape), means.reshape(stats), inv_stds.reshape(stats)]


for _kernel in (fused_matmul_gelu_jit, gelu_jit, geglu_jit, layer_norm_jit):
    _kernel.jit = True  # type: ignore[attr-defined]


def _float32_rows(shapes: Sequence[tuple[int, ...] | None]) -> bool:
    return bool(shapes) and shapes[0] is not None and len(shapes[0]) >= 1 and shapes[0][-1] > 0


def _fused_matmul(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    gelu = attrs.get("activation") == "Gelu" and exact_gelu(attrs)
    return (
        [fused_matmul_gelu_jit]
        if gelu and len(shapes) > 1 and shapes[1] is not None and len(shapes[1]) == 2
        else []
    )


def _layer_norm_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    x = shapes[0] if shapes else None
    return [layer_norm_jit] if x is not None and len(x) >= 1 and x[-1] > 0 else []


CANDIDATES = {
    "Gelu": lambda attrs, shapes: [gelu_jit] if _float32_rows(shapes) else [],
    "FusedGeglu": lambda attrs, shapes: [geglu_jit] if _float32_rows(shapes) else [],
    "FusedMatMul": _fused_matmul,
    # offered wherever numba is loaded (this module: a GELU; not in jit.MODULES, so a LayerNorm
    # never brings numba in alone: engine.session._jit_ops weighs its RSS)
    "LayerNormalization": _layer_norm_candidates,
}
