"""Conv: im2col + matmul in general, a direct matmul for 1x1 kernels, tap sums for depthwise.

The planner picks the variant once per input-shape signature (``select_conv``); every
variant checks its own precondition and falls back to im2col, so a stale choice is only
slower, never wrong.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.registry import Kernel, register, selector
from engine.ops.scratch import scratch, zeroed

# im2col materialises C*K*P values per image; above this many bytes the batch is split.
COLUMN_BUDGET_BYTES = 64 * 1024 * 1024


def _prepare(
    inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, window.Window]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    group = int(attrs.get("group", 1))
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"Conv needs X and W of the same rank >= 3, got X{x.shape} W{w.shape}")
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(f"X{x.shape} and W{w.shape} do not agree with group={group}")
    kernel = tuple(w.shape[2:])
    if attrs.get("kernel_shape") and tuple(attrs["kernel_shape"]) != kernel:
        raise ValueError(f"kernel_shape {attrs['kernel_shape']} does not match W{w.shape}")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"bias B{b.shape} must have shape ({w.shape[0]},)")
    return x, w, b, group, window.geometry(attrs, tuple(x.shape[2:]), kernel)


def _finish(y: np.ndarray, b: np.ndarray | None, win: window.Window, dtype: np.dtype) -> np.ndarray:
    """(N, M, P) or (N, g, M/g, P) -> (N, M, *out), plus bias."""
    y = y.reshape(y.shape[0], -1, *win.out)
    if b is not None:
        y += b.reshape(1, -1, *([1] * len(win.out)))
    return y.astype(dtype, copy=False)


@register("Conv")
def conv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    shapes = [None if v is None else v.shape for v in inputs]
    return select_conv(attrs, shapes)(inputs, attrs)


@selector("Conv")
def select_conv(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> Kernel:
    x_shape, w_shape = shapes[0], shapes[1]
    if x_shape is None or w_shape is None or len(w_shape) < 3:
        return conv_im2col
    group = int(attrs.get("group", 1))
    if all(k == 1 for k in w_shape[2:]):
        return conv_1x1
    if group > 1 and group == x_shape[1] and w_shape[1] == 1:
        return conv_depthwise
    return conv_im2col


def conv_im2col(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    n, c = x.shape[:2]
    m, k, p = w.shape[0], math.prod(win.kernel), math.prod(win.out)
    xp = window.pad(x, win)
    wmat = w.reshape(group, m // group, (c // group) * k)
    dtype = np.result_type(x, w)
    y = np.empty((n, group, m // group, p), dtype=dtype)
    per_image = c * k * p * dtype.itemsize
    chunk = max(1, COLUMN_BUDGET_BYTES // max(per_image, 1))
    for start in range(0, n, chunk):
        part = xp[start : start + chunk]
        cols = scratch("im2col.cols", (part.shape[0], c, k, *win.out), dtype)
        np.stack([part[(slice(None), slice(None), *sl)] for _, sl in window.taps(win)], axis=2, out=cols)
        cols = cols.reshape(part.shape[0], group, (c // group) * k, p)
        np.matmul(wmat, cols, out=y[start : start + chunk])
    return [_finish(y, b, win, x.dtype)]


def conv_1x1(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    if any(k != 1 for k in win.kernel):
        return conv_im2col(inputs, attrs)
    n, c = x.shape[:2]
    m = w.shape[0]
    _, sl = next(window.taps(win))
    xs = window.pad(x, win)[(slice(None), slice(None), *sl)]
    xs = xs.reshape(n, group, c // group, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, c // group), xs)
    return [_finish(y, b, win, x.dtype)]


def conv_depthwise(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    n, c = x.shape[:2]
    if group != c or w.shape[1] != 1:
        return conv_im2col(inputs, attrs)
    mult = w.shape[0] // c
    xp = window.pad(x, win)
    wk = w.reshape(c, mult, *win.kernel)
    ones = [1] * len(win.out)
    y = np.zeros((n, c, mult, *win.out), dtype=np.result_type(x, w))
    for index, sl in window.taps(win):
        patch = xp[(slice(None), slice(None), *sl)]
        y += patch[:, :, None] * wk[(slice(None), slice(None), *index)].reshape(1, c, mult, *ones)
    return [_finish(y, b, win, x.dtype)]


# -- variants the planner measures per node (engine/search.py) -----------------------------------


def _depthwise_ok(x: np.ndarray, w: np.ndarray, group: int, win: window.Window) -> bool:
    return (
        x.ndim == 4
        and group == x.shape[1]
        and w.shape[0] == group
        and w.shape[1] == 1
        and all(d == 1 for d in win.dilations)
    )


def conv_depthwise_flat(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Depthwise 2-D conv as shifted multiply-adds over flattened rows.

    The (zero-padded) input is split into stride x stride phases, each stored as one flat
    row per channel, so every tap is a single contiguous slice and every multiply-add runs
    over the whole image at once (the columns past the output width are computed and
    dropped).  Best for large images with few channels.
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _depthwise_ok(x, w, group, win):
        return conv_depthwise(inputs, attrs)
    n, c, height, width = x.shape
    (kh, kw), (sh, sw), (ho, wo) = win.kernel, win.strides, win.out
    pt, pl = win.pads_begin
    hph, wph = ho + (kh - 1) // sh + 1, wo + (kw - 1) // sw
    dtype = np.result_type(x, w)
    phases = zeroed("dw_flat.phases", (sh * sw, n, c, hph, wph), dtype)
    for a in range(sh):
        r0, r1 = max(0, -(-(pt - a) // sh)), min(hph, (height - 1 + pt - a) // sh + 1)
        for bb in range(sw):
            q0, q1 = max(0, -(-(pl - bb) // sw)), min(wph, (width - 1 + pl - bb) // sw + 1)
            if r1 > r0 and q1 > q0:
                rows = slice(a + r0 * sh - pt, a + (r1 - 1) * sh - pt + 1, sh)
                cols = slice(bb + q0 * sw - pl, bb + (q1 - 1) * sw - pl + 1, sw)
                phases[a * sw + bb, :, :, r0:r1, q0:q1] = x[:, :, rows, cols]
    flat = phases.reshape(sh * sw, n, c, hph * wph)
    length = ho * wph
    wk = w.reshape(c, kh, kw).astype(dtype, copy=False)
    acc = scratch("dw_flat.acc", (n, c, length), dtype)
    tmp = scratch("dw_flat.tmp", (n, c, length), dtype)
    for tap, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        offset = (i // sh) * wph + j // sw
        src = flat[(i % sh) * sw + j % sw, :, :, offset : offset + length]
        weight = wk[:, i, j].reshape(1, c, 1)
        if tap == 0:
            np.multiply(src, weight, out=acc)
        else:
            np.multiply(src, weight, out=tmp)
            acc += tmp
    y = np.empty((n, c, ho, wo), dtype=dtype)
    cropped = acc.reshape(n, c, ho, wph)[:, :, :, :wo]
    if b is not None:
        np.add(cropped, b.reshape(1, c, 1, 1), out=y)
    else:
        np.copyto(y, cropped)
    return [y.astype(x.dtype, copy=False)]


def conv_depthwise_nhwc(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Depthwise conv with channels last, so each multiply-add's inner loop runs over the
    channels (long for the late, small-image layers) with one weight vector per tap."""
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _depthwise_ok(x, w, group, win):
        return conv_depthwise(inputs, attrs)
    c = x.shape[1]
    dtype = np.result_type(x, w)
    padded = window.pad(x, win)
    xp = scratch("dw_nhwc.x", (padded.shape[0], *padded.shape[2:], c), dtype)
    np.copyto(xp, padded.transpose(0, 2, 3, 1))
    wk = np.ascontiguousarray(w.reshape(c, -1).T, dtype=dtype)  # (taps, c)
    acc = scratch("dw_nhwc.acc", (x.shape[0], *win.out, c), dtype)
    tmp = scratch("dw_nhwc.tmp", (x.shape[0], *win.out, c), dtype)
    for tap, (_, sl) in enumerate(window.taps(win)):
        patch = xp[(slice(None), *sl, slice(None))]
        if tap == 0:
            np.multiply(patch, wk[tap], out=acc)
        else:
            np.multiply(patch, wk[tap], out=tmp)
            acc += tmp
    if b is not None:
        acc += b
    y = np.empty((x.shape[0], c, *win.out), dtype=x.dtype)
    np.copyto(y, acc.transpose(0, 3, 1, 2))
    return [y]


# Winograd F(2x2, 3x3) (Lavin & Gray 2015): each 2x2 output tile from a 4x4 input tile with
# 16 multiplies per channel pair instead of 36, i.e. 2.25x fewer than direct convolution.
_WINO_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)


def winograd_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    return (
        len(x_shape) == 4
        and tuple(w_shape[2:]) == (3, 3)
        and int(attrs.get("group", 1)) == 1
        and all(s == 1 for s in (attrs.get("strides") or [1, 1]))
        and all(d == 1 for d in (attrs.get("dilations") or [1, 1]))
    )


def pack_winograd(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) weights -> U = G g G^T as (16, M, C), the layout the 16 GEMMs read."""
    u = np.einsum("ik,mckl,jl->ijmc", _WINO_G, w.astype(np.float64), _WINO_G, optimize=True)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]).astype(w.dtype))


def conv_winograd(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(2x2, 3x3); input 1 may be pre-packed by ``pack_winograd``."""
    x, packed = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if packed.ndim == 4:  # not pre-packed (a run outside a plan)
        if not winograd_ok(x.shape, packed.shape, attrs):
            return conv_im2col(inputs, attrs)
        packed = pack_winograd(packed)
    m, c = packed.shape[1:]
    n, _, height, width = x.shape
    win = window.geometry(attrs, (height, width), (3, 3))
    ho, wo = win.out
    th, tw = -(-ho // 2), -(-wo // 2)
    dtype = np.result_type(x, packed)
    xp = zeroed("wino.x", (n, c, 2 * th + 2, 2 * tw + 2), dtype)
    pt, pl = win.pads_begin
    rows = slice(max(0, -pt), min(height, 2 * th + 2 - pt))
    cols = slice(max(0, -pl), min(width, 2 * tw + 2 - pl))
    xp[:, :, rows.start + pt : rows.stop + pt, cols.start + pl : cols.stop + pl] = x[:, :, rows, cols]
    # even/odd rows and columns as four contiguous phases, so every tile element below is a
    # view with a contiguous inner axis (strided views made the transform 10x slower)
    phase = [
        [scratch(f"wino.phase{p}{q}", (n, c, th + 1, tw + 1), dtype) for q in range(2)] for p in range(2)
    ]
    for p in range(2):
        for q in range(2):
            np.copyto(phase[p][q], xp[:, :, p::2, q::2])
    d = [
        [phase[a % 2][bb % 2][:, :, a // 2 : a // 2 + th, bb // 2 : bb // 2 + tw] for bb in range(4)]
        for a in range(4)
    ]
    # B^T d B, rows then columns; V[4*i + j] has shape (n, c, th, tw)
    v = scratch("wino.v", (16, n, c, th, tw), dtype)
    t = scratch("wino.t", (4, 4, n, c, th, tw), dtype)
    for bb in range(4):
        np.subtract(d[0][bb], d[2][bb], out=t[0, bb])
        np.add(d[1][bb], d[2][bb], out=t[1, bb])
        np.subtract(d[2][bb], d[1][bb], out=t[2, bb])
        np.subtract(d[1][bb], d[3][bb], out=t[3, bb])
    for a in range(4):
        np.subtract(t[a, 0], t[a, 2], out=v[4 * a])
        np.add(t[a, 1], t[a, 2], out=v[4 * a + 1])
        np.subtract(t[a, 2], t[a, 1], out=v[4 * a + 2])
        np.subtract(t[a, 1], t[a, 3], out=v[4 * a + 3])
    tiles = th * tw
    prod = scratch("wino.prod", (16, n, m, tiles), dtype)
    if n == 1:
        np.matmul(packed, v.reshape(16, c, tiles), out=prod.reshape(16, m, tiles))
    else:
        np.matmul(packed[:, None], v.reshape(16, n, c, tiles), out=prod)
    prod = prod.reshape(16, n, m, th, tw)
    # A^T m A: rows (4 -> 2) then columns (4 -> 2), straight into the interleaved output
    s = scratch("wino.s", (2, 4, n, m, th, tw), dtype)
    for j in range(4):
        np.add(prod[j], prod[4 + j], out=s[0, j])
        s[0, j] += prod[8 + j]
        np.subtract(prod[4 + j], prod[8 + j], out=s[1, j])
        s[1, j] -= prod[12 + j]
    y = np.empty((n, m, 2 * th, 2 * tw), dtype=dtype)
    for i in range(2):
        out0 = y[:, :, i::2, 0::2]
        np.add(s[i, 0], s[i, 1], out=out0)
        out0 += s[i, 2]
        out1 = y[:, :, i::2, 1::2]
        np.subtract(s[i, 1], s[i, 2], out=out1)
        out1 -= s[i, 3]
    if (2 * th, 2 * tw) != (ho, wo):
        y = np.ascontiguousarray(y[:, :, :ho, :wo])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return [y.astype(x.dtype, copy=False)]


conv_winograd.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_winograd(inputs[1])} if winograd_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


def conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    """Every Conv variant that can run these shapes, the selector's pick first."""
    x_shape, w_shape = shapes[0], shapes[1]
    first = select_conv(attrs, shapes)
    found = [first]
    if x_shape is None or w_shape is None or len(x_shape) != 4:
        return found
    group = int(attrs.get("group", 1))
    if first is conv_depthwise and all(d == 1 for d in (attrs.get("dilations") or [1, 1])):
        found += [conv_depthwise_flat, conv_depthwise_nhwc]
    if group == 1 and winograd_ok(x_shape, w_shape, attrs):
        found.append(conv_winograd)
    return found
