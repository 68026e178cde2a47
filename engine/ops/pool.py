"""MaxPool, AveragePool and the global pools, N-d, by summing/maxing over kernel taps."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv import PING, PONG
from engine.ops.registry import check, register
from engine.ops.scratch import scratch


def _geometry(x: np.ndarray, attrs: dict[str, Any]) -> window.Window:
    if x.ndim < 3:
        raise ValueError(f"pooling needs an input of rank >= 3, got {x.shape}")
    kernel = attrs.get("kernel_shape")
    if not kernel or len(kernel) != x.ndim - 2:
        raise ValueError(f"kernel_shape {kernel} does not match input {x.shape}")
    return window.geometry(attrs, tuple(x.shape[2:]), tuple(kernel))


def _lowest(dtype: np.dtype) -> float | int:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


@check("MaxPool")
def check_max_pool(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    if n_outputs > 1:
        return "the Indices output of MaxPool is not implemented"
    return None


@register("MaxPool")
def max_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Max over the window one spatial axis at a time (max is separable): 3+3 passes for a 3x3
    window instead of 9, and no padded copy (taps are clipped to the input instead)."""
    x = inputs[0]
    win = _geometry(x, attrs)
    if _is_3x3_stride_2(x, win):
        pixels = x.transpose(0, 2, 3, 1)
        if pixels.flags.c_contiguous and not x.flags.c_contiguous:
            return [_max_pool_3x3_stride_2_channels_last(pixels).transpose(0, 3, 1, 2)]
        return [_max_pool_3x3_stride_2(x)]
    y = x
    last = x.ndim - 1
    for axis in range(2, x.ndim):
        i = axis - 2
        purpose = None if axis == last else f"max_pool.axis{axis}"
        y = _max_along(
            y, axis, win.kernel[i], win.strides[i], win.dilations[i], win.pads_begin[i], win.out[i], purpose
        )
    return [y if y is not x else x.copy()]


def _is_3x3_stride_2(x: np.ndarray, win: window.Window) -> bool:
    """ResNet's stem pool: 3x3, stride 2, one cell of leading padding, even sizes halved."""
    return (
        x.ndim == 4
        and x.size > 0
        and win.kernel == (3, 3)
        and win.strides == (2, 2)
        and win.dilations == (1, 1)
        and win.pads_begin == (1, 1)
        and x.shape[2] % 2 == 0
        and x.shape[3] % 2 == 0
        and win.out == (x.shape[2] // 2, x.shape[3] // 2)
    )


def _max_pool_3x3_stride_2(x: np.ndarray) -> np.ndarray:
    """The 3x3/2 pool with the column pass over whole flat arrays: numpy's strided (non-SIMD)
    loops and per-row overhead made the separable form 0.53 ms on ResNet's 64x112x112; 0.42.

    Rows as in the separable form (output row i = max of rows 2i-1, 2i, 2i+1, each a whole
    contiguous row).  Columns: even and odd columns split into two contiguous halves, so
    output column j = max(even[j], odd[j], odd[j-1]) is two flat passes, plus a fix-up of
    column 0 (where odd[j-1] is the last cell of the row above).
    """
    n, c, height, width = x.shape
    ho, wo = height // 2, width // 2
    planes = x.reshape(n * c, height, width)
    # the convs' work buffers: the stem conv before this pool has just used them
    rows = scratch(PING, (n * c, ho, width), x.dtype)
    np.maximum(planes[:, 0::2], planes[:, 1::2], out=rows)
    np.maximum(rows[:, 1:], planes[:, 1:-1:2], out=rows[:, 1:])  # row 0 has no row above
    halves = scratch(PONG, (2, n * c * ho * wo), x.dtype)
    np.copyto(halves, rows.reshape(-1, 2).T)
    even, odd = halves
    y = np.empty((n, c, ho, wo), dtype=x.dtype)
    out = y.reshape(-1)
    np.maximum(even, odd, out=out)
    np.maximum(out[1:], odd[:-1], out=out[1:])
    first = y.reshape(-1, wo)[:, 0]
    np.maximum(even.reshape(-1, wo)[:, 0], odd.reshape(-1, wo)[:, 0], out=first)
    return y


def _max_pool_3x3_stride_2_channels_last(pixels: np.ndarray) -> np.ndarray:
    """The 3x3/2 pool of a channels-last input (N, H, W, C), left channels last: every pass runs
    over whole C-channel runs.  A JIT stem conv leaves ResNet's 64x112x112 channels last, and
    the NCHW form's reshape copied it first: 1.45 ms, against onnxruntime's 0.12."""
    n, height, width, c = pixels.shape
    ho, wo = height // 2, width // 2
    rows = scratch(PING, (n, ho, width, c), pixels.dtype)
    np.maximum(pixels[:, 0::2], pixels[:, 1::2], out=rows)
    np.maximum(rows[:, 1:], pixels[:, 1:-1:2], out=rows[:, 1:])  # row 0 has no row above
    y = np.empty((n, ho, wo, c), dtype=pixels.dtype)
    np.maximum(rows[:, :, 0::2], rows[:, :, 1::2], out=y)
    np.maximum(y[:, :, 1:], rows[:, :, 1:-1:2], out=y[:, :, 1:])  # column 0 has none left of it
    return y


def _max_along(
    x: np.ndarray, axis: int, k: int, stride: int, dilation: int, pad: int, size: int, purpose: str | None
) -> np.ndarray:
    """Max over a 1-D window along ``axis``; taps falling in the padding are skipped."""
    shape = (*x.shape[:axis], size, *x.shape[axis + 1 :])
    y = np.empty(shape, x.dtype) if purpose is None else scratch(purpose, shape, x.dtype)
    lead = (slice(None),) * axis
    spans = []  # per tap: the outputs it reaches and the input slice it reads for them
    for tap in range(k):
        offset = tap * dilation - pad  # input index of output j is stride * j + offset
        first = max(0, -(offset // stride))  # ceil(-offset / stride)
        end = min(size, (x.shape[axis] - 1 - offset) // stride + 1)
        if end > first:
            spans.append(
                (first, end, slice(stride * first + offset, stride * (end - 1) + offset + 1, stride))
            )
    # a tap reaching every output initialises y by a copy: one pass less than fill + max
    full = next((span for span in spans if span[:2] == (0, size)), None)
    if full is not None:
        np.copyto(y, x[(*lead, full[2])])
        spans.remove(full)
    else:
        y.fill(_lowest(x.dtype))
    for first, end, src in spans:
        out = y[(*lead, slice(first, end))]
        np.maximum(out, x[(*lead, src)], out=out)
    return y


@register("AveragePool")
def average_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    win = _geometry(x, attrs)
    xp = window.pad(x, win, 0)
    y = np.zeros((*x.shape[:2], *win.out), dtype=x.dtype)
    for _, sl in window.taps(win):
        y += xp[(slice(None), slice(None), *sl)]
    return [y / _counts(x, win, attrs).astype(x.dtype)]


def _counts(x: np.ndarray, win: window.Window, attrs: dict[str, Any]) -> np.ndarray:
    """How many cells each window averages: the real ones, plus the padding if count_include_pad.

    Cells added only to complete a ceil_mode window never count.
    """
    nd = len(win.out)
    counted_begin, counted_end = [0] * nd, [0] * nd
    if attrs.get("count_include_pad", 0):
        if attrs.get("auto_pad", "NOTSET") == "NOTSET":
            pads = list(attrs.get("pads") or [0] * (2 * nd))
            counted_begin, counted_end = pads[:nd], pads[nd:]
        else:
            counted_begin, counted_end = list(win.pads_begin), list(win.pads_end)
    mask = np.ones((1, 1, *x.shape[2:]), dtype=np.int64)
    mask = np.pad(mask, [(0, 0), (0, 0), *zip(counted_begin, counted_end, strict=True)], constant_values=1)
    rest = [
        (b - cb, e - ce)
        for b, e, cb, ce in zip(win.pads_begin, win.pads_end, counted_begin, counted_end, strict=True)
    ]
    mask = np.pad(mask, [(0, 0), (0, 0), *rest], constant_values=0)
    counts = np.zeros((1, 1, *win.out), dtype=np.int64)
    for _, sl in window.taps(win):
        counts += mask[(slice(None), slice(None), *sl)]
    return counts


@register("GlobalAveragePool")
def global_average_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)]


@register("GlobalMaxPool")
def global_max_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]
