"""GroupNormalization and FusedGroupNorm (+ SiLU) as JIT kernels (numba): the twins of
group_norm.py's numpy forms.

numpy's form makes five whole-tensor passes (the centred copy, the variance, the scaling, the
scale, the bias) and SiLU three more (exp, add, divide) with a temporary each; at a UNet's 32x32
latents a group (2-4 channels of 1024 positions, 8-16 KiB) fits in L1, so this takes the mean
and the centred variance (two passes, as numpy's form: not E[x^2] - E[x]^2, which cancels) and
then writes ``x * a + b`` per channel, SiLU applied to each row while it is in cache (e^-y by
exp_jit's vectorised 2^x).  Groups in parallel (prange) when the session allows two threads.
No fastmath: the sums run over eight interleaved lanes, so they vectorise without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange, types

from engine import jit
from engine.ops.exp_jit import exp2_row
from engine.ops.fused import LOG2_E
from engine.ops.group_norm import fused_group_norm, group_normalization
from engine.ops.normalization import DEFAULT_EPSILON
from engine.ops.registry import Kernel

_F32 = types.float32
_ROW_IN = jit.array(_F32, 1, "C", readonly=True)
_ROW = jit.array(_F32, 1, "C")
_BITS = jit.array(types.int32, 1, "C")
_GROUPS_IN = jit.array(_F32, 2, "C", readonly=True)  # [samples * groups, positions of a group]
_GROUPS = jit.array(_F32, 2, "C")
# groups, scale [C], bias [C], epsilon, channels per group, SiLU?, out, the rows [first, last)
_SIGNATURE = types.void(
    _GROUPS_IN, _ROW_IN, _ROW_IN, _F32, types.int64, types.boolean, _GROUPS, types.int64, types.int64
)


@jit.njit([_F32(_ROW_IN)], error_model="numpy")
def _sum(row):  # noqa: ANN001, ANN202
    """sum(row) over eight interleaved lanes (one running sum waits on the last add)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0)
    n = row.shape[0]
    whole = n - n % 8
    for k in range(0, whole, 8):
        s0, s1, s2, s3 = s0 + row[k], s1 + row[k + 1], s2 + row[k + 2], s3 + row[k + 3]
        s4, s5, s6, s7 = s4 + row[k + 4], s5 + row[k + 5], s6 + row[k + 6], s7 + row[k + 7]
    for k in range(whole, n):
        s0 += row[k]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@jit.njit([_F32(_ROW_IN, _F32)], error_model="numpy")
def _squares(row, mean):  # noqa: ANN001, ANN202
    """sum((row - mean)^2) over eight interleaved lanes."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0)
    n = row.shape[0]
    whole = n - n % 8
    for k in range(0, whole, 8):
        d0, d1, d2, d3 = row[k] - mean, row[k + 1] - mean, row[k + 2] - mean, row[k + 3] - mean
        d4, d5, d6, d7 = row[k + 4] - mean, row[k + 5] - mean, row[k + 6] - mean, row[k + 7] - mean
        s0, s1, s2, s3 = s0 + d0 * d0, s1 + d1 * d1, s2 + d2 * d2, s3 + d3 * d3
        s4, s5, s6, s7 = s4 + d4 * d4, s5 + d5 * d5, s6 + d6 * d6, s7 + d7 * d7
    for k in range(whole, n):
        d0 = row[k] - mean
        s0 += d0 * d0
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@jit.njit([_SIGNATURE], error_model="numpy")
def _groups(x, scale, bias, epsilon, count, silu, out, first, last):  # noqa: ANN001, ANN202
    """Rows [first, last) of x (one group each: ``count`` channels, their positions one after
    another): out = silu?((x - mean) / sqrt(var + eps) * scale[c] + bias[c]).  Called for all
    rows (one thread) or per chunk by ``_groups_parallel``: one compiled body for both."""
    size = x.shape[1]
    per = size // count
    spare, bits = np.empty(per, np.float32), np.empty(per, np.int32)
    groups = scale.shape[0] // count
    for r in range(first, last):
        src, dst, channel = x[r], out[r], (r % groups) * count
        mean = _sum(src) / np.float32(size)
        rstd = np.float32(1) / np.sqrt(_squares(src, mean) / np.float32(size) + epsilon)
        for ci in range(count):
            a = rstd * scale[channel + ci]
            b = bias[channel + ci] - mean * a
            row = dst[ci * per : (ci + 1) * per]
            for k in range(per):
                row[k] = src[ci * per + k] * a + b
            if silu:  # y / (1 + e^-y), e^-y = 2^(-y log2 e) by exp_jit's polynomial
                exp2_row(row, np.float32(-LOG2_E), np.float32(0), spare, bits, per)
                for k in range(per):
                    row[k] = row[k] / (np.float32(1) + spare[k])


@jit.njit([_SIGNATURE], parallel=True, error_model="numpy")
def _groups_parallel(x, scale, bias, epsilon, count, silu, out, first, last):  # noqa: ANN001, ANN202
    chunks = 8
    step = (last - first + chunks - 1) // chunks
    for c in prange(chunks):
        start = min(last, first + c * step)
        _groups(x, scale, bias, epsilon, count, silu, out, start, min(last, start + step))


def _run(inputs: list[np.ndarray | None], attrs: dict[str, Any], silu: bool) -> np.ndarray | None:
    """The JIT result, or None where it does not apply (not float32 [N, C, ...], C % groups)."""
    x, scale, bias = inputs[:3]
    groups = int(attrs["num_groups"])
    if x.dtype != np.float32 or x.ndim < 3 or x.shape[1] % groups or 0 in x.shape:
        return None
    flat = np.ascontiguousarray(x).reshape(x.shape[0] * groups, -1)
    out = np.empty(x.shape, np.float32)
    args = (
        flat,
        np.ascontiguousarray(scale, np.float32).reshape(-1),
        np.ascontiguousarray(bias, np.float32).reshape(-1),
        np.float32(attrs.get("epsilon", DEFAULT_EPSILON)),
        x.shape[1] // groups,
        silu,
        out.reshape(flat.shape),
    )
    jit.run(_groups, _groups_parallel, *args, 0, flat.shape[0])
    return out


def group_norm_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    out = _run(inputs, attrs, silu=False)
    return group_normalization(inputs, attrs) if out is None else [out]


def fused_group_norm_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    out = _run(inputs, attrs, silu=attrs.get("activation") == "Silu")
    return fused_group_norm(inputs, attrs) if out is None else [out]


for _kernel in (group_norm_jit, fused_group_norm_jit):
    _kernel.jit = True  # type: ignore[attr-defined]


def _provider(kernel: Kernel) -> Any:
    def provider(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
        x_shape = shapes[0] if shapes else None
        return [] if x_shape is None or len(x_shape) < 3 else [kernel]

    return provider


CANDIDATES = {
    "GroupNormalization": _provider(group_norm_jit),
    "FusedGroupNorm": _provider(fused_group_norm_jit),
}
