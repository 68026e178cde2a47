"""2^x for JIT kernels (numba) as a polynomial that vectorises: the twin of fastmath.py's forms.

numba compiles ``math.exp`` on float32 to a scalar libm call (no SVML here), which made a JIT
softmax twice numpy's time.  This is 2^x = 2^r * 2^f with r = round(x) and f in [-0.5, 0.5]:
2^f by a degree-6 polynomial (least squares on the relative error: < 1e-7 in exact arithmetic,
~1.2e-7 relative evaluated in float32, i.e. float32 rounding), and 2^r by writing r + 127 into
a float32's exponent bits.  numba has no scalar bit cast, so a row takes two vectorised passes:
the polynomial and the exponent bits into two L1-resident buffers, then their product.

Rounding uses the 1.5 * 2^23 trick (adding it rounds a float32 to an integer, half to even),
exact without fastmath.  x is clamped to [-127, 128] first: 2^-127 comes out as 0 (exponent
bits 0) and 2^128 as inf (exponent bits 255), the limits float32's own 2^x reaches there; NaN
stays NaN (the polynomial of NaN is NaN, whatever its exponent bits became).
"""

from __future__ import annotations

import numpy as np
from numba import types

from engine import jit

# 2^f on [-0.5, 0.5], f's powers 0..6 (fitted to minimise the relative error)
_C0, _C1, _C2, _C3 = 1.0000000004121685, 0.6931471992121028, 0.2402264736357017, 0.05550342272182115
_C4, _C5, _C6 = 0.009618491071216116, 0.0013394706615806554, 0.00015332501311382356
_ROUNDER = 12582912.0  # 1.5 * 2^23
LOW, HIGH = -127.0, 128.0

_F32 = types.float32
# Only LLVM's "contract" flag: a multiply and the add after it become one FMA (rounded once, so no
# less exact; ~25% off the polynomials here).  error_model="numpy" on every kernel: numba's default
# checks each float division for zero to raise ZeroDivisionError, a branch that keeps LLVM from
# vectorising the loop (GELU's divide ran scalar: 1.43 ns an element at ViT's 197x768, 0.66 after).
CONTRACT = {"contract"}
_ROW_IN = jit.array(_F32, 1, "C", readonly=True)
_ROW = jit.array(_F32, 1, "C")
_BITS = jit.array(types.int32, 1, "C")


@jit.njit([types.void(_ROW_IN, _F32, _F32, _ROW, _BITS, types.int64)], error_model="numpy", fastmath=CONTRACT)
def exp2_row(x, scale, shift, out, bits, n):  # noqa: ANN001, ANN202
    """out[:n] = 2^(scale * (x[:n] - shift)); ``bits`` is a scratch row of at least n int32."""
    for k in range(n):
        v = (x[k] - shift) * scale
        v = min(max(v, np.float32(LOW)), np.float32(HIGH))  # numba's min/max keep a NaN first argument
        r = (v + np.float32(_ROUNDER)) - np.float32(_ROUNDER)
        f = v - r
        p = np.float32(_C6) * f + np.float32(_C5)
        p = p * f + np.float32(_C4)
        p = p * f + np.float32(_C3)
        p = p * f + np.float32(_C2)
        p = p * f + np.float32(_C1)
        out[k] = p * f + np.float32(_C0)
        bits[k] = (np.int32(r) + np.int32(127)) << 23  # for NaN, any bits: NaN * them is NaN
    powers = bits[:n].view(np.float32)
    for k in range(n):
        out[k] *= powers[k]


def exp2(x: np.ndarray) -> np.ndarray:
    """2^x of a float32 vector (for tests and small callers)."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.empty_like(flat)
    exp2_row(flat, np.float32(1), np.float32(0), out, np.empty(flat.size, np.int32), flat.size)
    return out.reshape(np.shape(x))
