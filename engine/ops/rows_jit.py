"""Row-wise GELU as a JIT kernel (numba), alone or as FusedMatMul's bias + GELU epilogue: the
twin of fastmath.py's GELU forms.

numpy's fastest exact GELU here is fastmath.py's table form: 11 whole-array passes, two of them
gathers; this is one pass per row while it sits in L1, bias included.  It uses the same Phi
table and first-order step, so it agrees with the numpy table form to float32 rounding and with
the erf formula to ~6e-7 absolute; no fastmath.

Row-wise LayerNorm and Softmax JIT kernels were measured here and left out: LayerNorm within
noise of numpy's (61 vs 63 us at ViT's 197x192, 77 vs 67 at BERT's 128x384: numpy's form is
already four L1-resident passes), and with the mean summed more exactly than onnx's reference
sums it, it failed the reference test on rows far from zero; Softmax took twice numpy's time
(numba's float32 exp is a scalar libm call without Intel's SVML).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.ops import fastmath
from engine.ops.fused import apply_activation, fused_matmul
from engine.ops.registry import REGISTRY, Kernel

_F32, _F64, _I64, _BOOL = types.float32, types.float64, types.int64, types.boolean
_ROWS_IN = jit.array(_F32, 2, "C", readonly=True)
_ROWS_OUT = jit.array(_F32, 2, "C")
_VECTOR_IN = jit.array(_F32, 1, "A", readonly=True)  # A: a stride-0 packed scale is allowed too
_VECTOR_OUT = jit.array(_F32, 1, "C")


_GELU = types.void(
    _ROWS_OUT,
    _VECTOR_IN,
    _BOOL,
    jit.array(_F32, 1, "C", readonly=True),
    jit.array(_F32, 1, "C", readonly=True),
)
_HALF_WIDTH = float(fastmath._TABLE_HALF_WIDTH)
_STEPS = float(fastmath._STEPS_PER_UNIT)
_CENTRE = float(fastmath._CENTRE)
_LAST = 2 * fastmath._CENTRE


@jit.njit(
    [
        types.void(
            _VECTOR_OUT,
            _VECTOR_IN,
            _BOOL,
            jit.array(_F32, 1, "C", readonly=True),
            jit.array(_F32, 1, "C", readonly=True),
        )
    ]
)
def _gelu_row(row, bias, has_bias, values, slopes):  # noqa: ANN001, ANN202
    """row = gelu(row + bias) in place: x * Phi(x), Phi one step from its nearest table node."""
    for k in range(row.shape[0]):
        v = row[k] + bias[k] if has_bias else row[k]
        clipped = min(max(v, np.float32(-_HALF_WIDTH)), np.float32(_HALF_WIDTH))
        steps = clipped * np.float32(_STEPS) + np.float32(_CENTRE)
        # the nearest node (steps >= 0: truncation floors); kept inside the table whatever a NaN
        # converts to, and the NaN itself survives in v * phi
        index = min(max(int(steps + np.float32(0.5)), 0), _LAST)
        fraction = steps - np.float32(index)
        row[k] = v * (values[index] + fraction * slopes[index])


@jit.njit([_GELU])
def _gelu_serial(y, bias, has_bias, values, slopes):  # noqa: ANN001, ANN202
    for r in range(y.shape[0]):
        _gelu_row(y[r], bias, has_bias, values, slopes)


@jit.njit([_GELU], parallel=True)
def _gelu_parallel(y, bias, has_bias, values, slopes):  # noqa: ANN001, ANN202
    for r in prange(y.shape[0]):
        _gelu_row(y[r], bias, has_bias, values, slopes)


def gelu_rows_into(y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """y = gelu(y + bias) in place, for a C-contiguous float32 y (bias over its last axis)."""
    values, slopes = fastmath._phi_table()
    rows = y.reshape(-1, y.shape[-1])
    has_bias = bias is not None
    jit.run(_gelu_serial, _gelu_parallel, rows, bias if has_bias else values, has_bias, values, slopes)
    return y


def _exact_gelu(attrs: dict[str, Any]) -> bool:
    return (attrs.get("activation_attrs") or {}).get("approximate", "none") == "none"


def fused_matmul_gelu_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedMatMul with an exact GELU: the BLAS product, then bias and GELU in one JIT pass."""
    a, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    plain = a.dtype == w.dtype == np.float32 and w.ndim == 2 and a.ndim >= 1
    if not (plain and attrs.get("activation") == "Gelu" and _exact_gelu(attrs)):
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


for _kernel in (fused_matmul_gelu_jit, gelu_jit):
    _kernel.jit = True  # type: ignore[attr-defined]


def _float32_rows(shapes: Sequence[tuple[int, ...] | None]) -> bool:
    return bool(shapes) and shapes[0] is not None and len(shapes[0]) >= 1 and shapes[0][-1] > 0


def _fused_matmul(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    gelu = attrs.get("activation") == "Gelu" and _exact_gelu(attrs)
    return (
        [fused_matmul_gelu_jit]
        if gelu and len(shapes) > 1 and shapes[1] is not None and len(shapes[1]) == 2
        else []
    )


CANDIDATES = {
    "Gelu": lambda attrs, shapes: [gelu_jit] if _float32_rows(shapes) else [],
    "FusedMatMul": _fused_matmul,
}
