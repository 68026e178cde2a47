"""2-D MaxPool of a channels-last float32 input in one JIT pass (numba).

A JIT stem conv leaves ResNet's 64 x 112 x 112 activation channels last, and numpy's form of its
3x3/2 pool (pool.py) makes four strided passes over it: 1.17 ms a run on a Xeon whose L2 holds
2 MB of the input's 3.2, against onnxruntime's 0.23.  Here each output pixel is the max of its
window's input pixels, each a contiguous run of C channels, so the input is read once and the
output written once.  Taps in the padding are skipped; a NaN in a window makes its output NaN,
as np.maximum does in the numpy form.  Offered beside numpy's MaxPool for 4-D inputs; the
search keeps the faster (it falls back to numpy's for other dtypes and for an NCHW input).
Rides along with the conv kernels: a model whose only JIT candidate is its pool stays numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import types

from engine import jit
from engine.ops.pool import _geometry, max_pool
from engine.ops.registry import Kernel

_I64 = types.int64
_POOL = types.void(
    jit.array(types.float32, 4, "C", readonly=True), jit.array(types.float32, 4, "C"), *(_I64,) * 8
)


@jit.njit([_POOL], error_model="numpy")
def _max_nhwc(x, out, kh, kw, sh, sw, dh, dw, ph, pw):  # noqa: ANN001, ANN202
    """out[b, i, j, :] = max over the window's taps inside x of x[b, r, q, :] (NaN wins)."""
    n, height, width, c = x.shape
    ho, wo = out.shape[1], out.shape[2]
    lowest = np.float32(-np.inf)
    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                o = out[b, i, j]
                for ch in range(c):
                    o[ch] = lowest
                for u in range(kh):
                    r = i * sh + u * dh - ph
                    if r < 0 or r >= height:
                        continue
                    for v in range(kw):
                        q = j * sw + v * dw - pw
                        if q < 0 or q >= width:
                            continue
                        src = x[b, r, q]
                        for ch in range(c):
                            value = src[ch]
                            if value > o[ch] or value != value:  # a NaN stays (np.maximum's rule)
                                o[ch] = value


def max_pool_jit(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """MaxPool of a channels-last float32 (N, C, H, W) view, left channels last (numpy's for
    anything else)."""
    x = inputs[0]
    if x is None or x.ndim != 4 or x.dtype != np.float32:
        return max_pool(inputs, attrs)
    pixels = x.transpose(0, 2, 3, 1)
    if not pixels.flags.c_contiguous or x.flags.c_contiguous:  # NCHW (or C == 1): numpy's form
        return max_pool(inputs, attrs)
    win = _geometry(x, attrs)  # numpy's checks and errors: a 4-D input's window is 2-D
    out = np.empty((x.shape[0], *win.out, x.shape[1]), np.float32)
    _max_nhwc(pixels, out, *win.kernel, *win.strides, *win.dilations, *win.pads_begin)
    return [out.transpose(0, 3, 1, 2)]


max_pool_jit.jit = True  # type: ignore[attr-defined]


def _pool_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    x = shapes[0] if shapes else None
    kernel = attrs.get("kernel_shape") or ()
    return [max_pool_jit] if x is not None and len(x) == 4 and len(kernel) == 2 else []


CANDIDATES = {"MaxPool": _pool_candidates}
