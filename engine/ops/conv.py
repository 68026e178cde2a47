"""Conv: im2col + matmul in general, a direct matmul for 1x1 kernels, tap sums for depthwise.

The planner picks the variant once per input-shape signature (``select_conv``), or the
kernel search (engine/search.py) measures the candidates of ``conv_candidates``: im2col
over flat phases (junk columns or exact windows) for strided convs, the bias as a GEMM
column for 1x1, Winograd F(2x2, 3x3) and F(4x4, 3x3) for 3x3 stride 1, polyphase Winograd
for 3x3 stride 2, depthwise in two layouts.  Every variant checks its own precondition and
falls back to im2col, so a stale choice is only slower, never wrong.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.ops import inplace, window
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


def fused_bounds(attrs: dict[str, Any]) -> tuple[Any, Any] | None:
    """(low, high) of a FusedConv's Relu / Clip (None for an open side), else None.

    Kernels marked ``fuses_clip`` apply it in their last copy, saving a pass over the output
    (the search's FusedConv wrapper then skips it; applying it twice would be harmless)."""
    name = attrs.get("activation")
    if name == "Relu":
        return 0, None
    if name == "Clip":
        extra = attrs.get("activation_attrs") or {}
        return extra.get("min"), extra.get("max")
    return None


def _clipped_fallback(
    fallback: Kernel, inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> list[np.ndarray]:
    """A ``fuses_clip`` kernel handed shapes it cannot run: the fallback's result, with the
    Relu / Clip the search's wrapper now counts on this kernel having applied."""
    y = fallback(inputs, attrs)[0]
    bounds = fused_bounds(attrs)
    if bounds is not None:
        inplace.clip_into(y, *bounds, y)
    return [y]


def _in_batches(
    kernel: Kernel, inputs: list[np.ndarray | None], attrs: dict[str, Any], per_image: int
) -> list[np.ndarray]:
    """``kernel`` over slices of the batch whose work buffers stay within COLUMN_BUDGET_BYTES:
    scratch buffers live as long as the thread, so one sized for a whole large batch would
    keep hundreds of MB."""
    x, chunk = inputs[0], max(1, COLUMN_BUDGET_BYTES // max(per_image, 1))
    parts = [kernel([x[start : start + chunk], *inputs[1:]], attrs)[0] for start in range(0, len(x), chunk)]
    return [np.concatenate(parts)]


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
        dilated = any(d != 1 for d in attrs.get("dilations") or [])
        plain = len(x_shape) == 4 and w_shape[0] == group and not dilated
        # the flat form is the one the search keeps on most layers (3x faster than tap sums
        # over padded NCHW), so a first, unplanned run uses it too
        return conv_depthwise_flat if plain else conv_depthwise
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


def _flat_phases(x: np.ndarray, win: window.Window) -> tuple[np.ndarray, int, int]:
    """The zero-padded 2-D input split into stride x stride phases, each row-flattened.

    Returns (phases (sh*sw, N, C, hph*wph), hph, wph): output (r, q) of tap (i, j) reads
    phase ((i*dh) % sh, (j*dw) % sw) at flat index (r + i*dh // sh) * wph + q + j*dw // sw,
    so every tap is one contiguous slice covering all outputs (plus wph - Wo junk columns
    per row, which the caller drops).
    """
    n, c, height, width = x.shape
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    pt, pl = win.pads_begin
    hph, wph = ho + (kh - 1) * dh // sh + 1, wo + (kw - 1) * dw // sw
    phases = scratch("flat.phases", (sh * sw, n, c, hph, wph), np.result_type(x))
    for a in range(sh):
        r0, r1 = max(0, -(-(pt - a) // sh)), min(hph, (height - 1 + pt - a) // sh + 1)
        for bb in range(sw):
            q0, q1 = max(0, -(-(pl - bb) // sw)), min(wph, (width - 1 + pl - bb) // sw + 1)
            phase = phases[a * sw + bb]
            if r1 <= r0 or q1 <= q0:
                phase.fill(0)
                continue
            # zero only what the input does not cover: a full fill is one more pass
            phase[:, :, :r0] = 0
            phase[:, :, r1:] = 0
            phase[:, :, r0:r1, :q0] = 0
            phase[:, :, r0:r1, q1:] = 0
            rows = slice(a + r0 * sh - pt, a + (r1 - 1) * sh - pt + 1, sh)
            cols = slice(bb + q0 * sw - pl, bb + (q1 - 1) * sw - pl + 1, sw)
            phase[:, :, r0:r1, q0:q1] = x[:, :, rows, cols]
    return phases.reshape(sh * sw, n, c, hph * wph), hph, wph


def _flat_tap(flat: np.ndarray, win: window.Window, wph: int, i: int, j: int) -> np.ndarray:
    """Tap (i, j) of ``_flat_phases`` output: (N, C, Ho*wph), a contiguous slice per channel."""
    (sh, sw), (dh, dw) = win.strides, win.dilations
    offset = (i * dh // sh) * wph + j * dw // sw
    return flat[(i * dh % sh) * sw + j * dw % sw, :, :, offset : offset + win.out[0] * wph]


def conv_im2col_flat(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """2-D im2col whose columns are copied as whole contiguous rows (``_flat_phases``) instead
    of strided windows: for strided convs (ResNet's 7x7/2 stem) the copy was ~30% of the time.

    Without groups the bias rides in the GEMM (a row of ones under the columns), so the one
    pass that crops the junk columns also applies a fused Relu / Clip (``fuses_clip``).
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if x.ndim != 4:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (ho, wo), m = win.kernel, win.out, w.shape[0]
    dtype = np.result_type(x, w)
    per_image = (c * kh * kw + 1 + m) * ho * (wo + kw) * dtype.itemsize  # columns + GEMM output
    if n > 1 and n * per_image > COLUMN_BUDGET_BYTES:
        return _in_batches(conv_im2col_flat, inputs, attrs, per_image)
    flat, _, wph = _flat_phases(x.astype(dtype, copy=False), win)
    bias_row = b is not None and group == 1
    depth = c * kh * kw
    cols = scratch("im2col_flat.cols", (n, depth + bias_row, ho * wph), dtype)
    taps = cols[:, :depth].reshape(n, c, kh * kw, ho * wph)
    for tap, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        np.copyto(taps[:, :, tap], _flat_tap(flat, win, wph, i, j))
    wmat = w.reshape(group, m // group, (c // group) * kh * kw).astype(dtype, copy=False)
    if bias_row:
        cols[:, depth] = 1
        wmat = np.concatenate([wmat[0], b.reshape(m, 1).astype(dtype)], axis=1)[None]
    full = scratch("im2col_flat.y", (n, group, m // group, ho * wph), dtype)
    np.matmul(wmat, cols.reshape(n, group, -1, ho * wph), out=full)
    y = np.empty((n, m, ho, wo), dtype=dtype)
    cropped = full.reshape(n, m, ho, wph)[:, :, :, :wo]
    if b is not None and not bias_row:
        np.add(cropped, b.reshape(1, m, 1, 1), out=y)
        cropped = y
    bounds = fused_bounds(attrs)
    if bounds is not None:
        inplace.clip_into(cropped, *bounds, y)
    elif cropped is not y:
        np.copyto(y, cropped)
    return [y.astype(x.dtype, copy=False)]


conv_im2col_flat.fuses_clip = True  # type: ignore[attr-defined]


def conv_im2col_phased(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Strided 2-D im2col whose columns are copied from the ``_flat_phases`` split as exact
    (Ho, Wo) windows: no junk columns, so the GEMM writes the output directly (bias as a
    row of ones under the columns) and a fused Relu / Clip (``fuses_clip``) is one
    contiguous pass in place, where ``conv_im2col_flat`` crops through a strided copy.
    Measured on ResNet's 7x7/2 stem: 3.0 ms against 3.2-3.4 ms."""
    x, w, b, group, win = _prepare(inputs, attrs)
    if x.ndim != 4 or group != 1:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    m, depth = w.shape[0], c * kh * kw
    dtype = np.result_type(x, w)
    if n > 1 and n * (depth + 1) * ho * wo * dtype.itemsize > COLUMN_BUDGET_BYTES:
        return _in_batches(conv_im2col_phased, inputs, attrs, (depth + 1) * ho * wo * dtype.itemsize)
    flat, hph, wph = _flat_phases(x.astype(dtype, copy=False), win)
    phases = flat.reshape(sh * sw, n, c, hph, wph)
    # conv_im2col_flat's buffer: one of the two runs on a layer, a buffer each would add to the peak
    cols = scratch("im2col_flat.cols", (n, depth + (b is not None), ho * wo), dtype)
    taps = cols[:, :depth].reshape(n, c, kh * kw, ho, wo)
    for tap, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        r, q = i * dh // sh, j * dw // sw
        np.copyto(taps[:, :, tap], phases[(i * dh % sh) * sw + j * dw % sw, :, :, r : r + ho, q : q + wo])
    wmat = w.reshape(m, depth).astype(dtype, copy=False)
    if b is not None:
        cols[:, depth] = 1
        wmat = np.concatenate([wmat, b.reshape(m, 1).astype(dtype)], axis=1)
    y = np.empty((n, m, ho, wo), dtype=dtype)
    np.matmul(wmat, cols, out=y.reshape(n, m, ho * wo))
    bounds = fused_bounds(attrs)
    if bounds is not None:
        inplace.clip_into(y, *bounds, y)
    return [y.astype(x.dtype, copy=False)]


conv_im2col_phased.fuses_clip = True  # type: ignore[attr-defined]


def conv_1x1_bias_row(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv with the bias as one more GEMM column: [W | b] @ [X; 1].

    Copying the (small) input once is cheaper than a bias pass over the output when the
    output has many more channels than the input (MobileNet's expansion convs, 6x).
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if b is None or group != 1 or x.ndim < 3 or any(k != 1 for k in win.kernel) or win.padded:
        return conv_1x1(inputs, attrs)
    n, c = x.shape[:2]
    m, p = w.shape[0], math.prod(win.out)
    dtype = np.result_type(x, w, b)
    _, sl = next(window.taps(win))
    rows = scratch("1x1_bias.x", (n, c + 1, p), dtype)
    np.copyto(rows[:, :c].reshape(n, c, *win.out), x[(slice(None), slice(None), *sl)])
    rows[:, c] = 1
    weights = np.empty((m, c + 1), dtype=dtype)
    weights[:, :c] = w.reshape(m, c)
    weights[:, c] = b
    y = np.matmul(weights, rows)
    return [y.reshape(n, m, *win.out).astype(x.dtype, copy=False)]


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
    n, c = x.shape[:2]
    (kh, kw), (ho, wo) = win.kernel, win.out
    dtype = np.result_type(x, w)
    flat, _, wph = _flat_phases(x.astype(dtype, copy=False), win)
    length = ho * wph
    wk = w.reshape(c, kh, kw).astype(dtype, copy=False)
    acc = scratch("dw_flat.acc", (n, c, length), dtype)
    tmp = scratch("dw_flat.tmp", (n, c, length), dtype)
    for tap, (i, j) in enumerate(itertools.product(range(kh), range(kw))):
        src = _flat_tap(flat, win, wph, i, j)
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
    channels (long for the late, small-image layers) with one weight vector per tap.

    The input is transposed straight into a padded scratch image (only its border zeroed),
    and bias and a fused Relu / Clip (``fuses_clip``) run on the contiguous accumulator
    before the one transposing copy out.
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _depthwise_ok(x, w, group, win):
        return _clipped_fallback(conv_depthwise, inputs, attrs)
    n, c, height, width = x.shape
    dtype = np.result_type(x, w)
    xp = _padded_channels_last(x, win, dtype)
    wk = np.ascontiguousarray(w.reshape(c, -1).T, dtype=dtype)  # (taps, c)
    acc = scratch("dw_nhwc.acc", (n, *win.out, c), dtype)
    tmp = scratch("dw_nhwc.tmp", (n, *win.out, c), dtype)
    for tap, (_, sl) in enumerate(window.taps(win)):
        patch = xp[(slice(None), *sl, slice(None))]
        if tap == 0:
            np.multiply(patch, wk[tap], out=acc)
        else:
            np.multiply(patch, wk[tap], out=tmp)
            acc += tmp
    if b is not None:
        acc += b.astype(dtype, copy=False)
    bounds = fused_bounds(attrs)
    if bounds is not None:
        inplace.clip_into(acc, *bounds, acc)
    y = np.empty((n, c, *win.out), dtype=x.dtype)
    np.copyto(y, acc.transpose(0, 3, 1, 2))
    return [y]


conv_depthwise_nhwc.fuses_clip = True  # type: ignore[attr-defined]


def _padded_channels_last(x: np.ndarray, win: window.Window, dtype: np.dtype) -> np.ndarray:
    """(N, C, H, W) -> zero-padded (N, Hp, Wp, C) scratch; only the padding border is zeroed."""
    n, c, height, width = x.shape
    (pt, pl), (pb, pr) = win.pads_begin, win.pads_end
    xp = scratch("dw_nhwc.x", (n, height + pt + pb, width + pl + pr, c), dtype)
    xp[:, :pt] = 0
    xp[:, pt + height :] = 0
    xp[:, pt : pt + height, :pl] = 0
    xp[:, pt : pt + height, pl + width :] = 0
    np.copyto(xp[:, pt : pt + height, pl : pl + width], x.transpose(0, 2, 3, 1))
    return xp


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
    return _pack_transformed(w, _WINO_G)


def _winograd_weights(
    inputs: list[np.ndarray | None],
    attrs: dict[str, Any],
    ok: Callable[[tuple[int, ...], tuple[int, ...], dict[str, Any]], bool],
    pack: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray | None:
    """Input 1 in ``pack``'s layout: as given when the plan pre-packed it, packed now in a run
    outside a plan, or None when ``ok`` says these shapes are not the kernel's (fall back)."""
    x, w = inputs[0], inputs[1]
    if w.ndim != 4:
        return w
    return pack(w) if ok(x.shape, w.shape, attrs) else None


def conv_winograd(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(2x2, 3x3); input 1 may be pre-packed by ``pack_winograd``."""
    packed = _winograd_weights(inputs, attrs, winograd_ok, pack_winograd)
    if packed is None:
        return conv_im2col(inputs, attrs)
    x, b = inputs[0], inputs[2] if len(inputs) > 2 else None
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


# Winograd F(4x4, 3x3): each 4x4 output tile from a 6x6 input tile, 36 multiplies per channel
# pair instead of 144 (4x fewer).  The transforms run as small matmuls over every tile at once
# (B^T d B and A^T m A, one side at a time), so each is one BLAS call, not one ufunc per term.
_WINO4_BT = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)
_WINO4_G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
    dtype=np.float64,
)
_WINO4_AT = np.array(
    [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], dtype=np.float64
)
# Below this many 4x4 output tiles per image the 36 GEMMs are too thin to pay for reading
# filters 4x the original size (ResNet's 7x7 stage: slower than im2col, 38 MB per layer).
WINO4_MIN_TILES = 16


def winograd4_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    if not winograd_ok(x_shape, w_shape, attrs):
        return False
    win = window.geometry(attrs, tuple(x_shape[2:]), (3, 3))
    return -(-win.out[0] // 4) * -(-win.out[1] // 4) >= WINO4_MIN_TILES


def pack_winograd4(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) weights -> U = G g G^T as (36, C, M), the right-hand side of the 36 GEMMs."""
    return np.ascontiguousarray(_pack_transformed(w, _WINO4_G).transpose(0, 2, 1))


def _pack_transformed(w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """G w G^T per (m, c) filter as (r*r, M, C), in float64 a few output channels at a time:
    the whole float64 product of a 256x256 layer is ~40 MB and would set the peak RSS."""
    r = g.shape[0]
    packed = np.empty((r, r, w.shape[0], w.shape[1]), dtype=w.dtype)
    step = max(1, (1 << 20) // max(1, w.shape[1] * r * r * 8))  # ~1 MB of float64 per block
    for m0 in range(0, w.shape[0], step):
        block = w[m0 : m0 + step].astype(np.float64)
        packed[:, :, m0 : m0 + step] = np.einsum("ik,mckl,jl->ijmc", g, block, g, optimize=True)
    return packed.reshape(r * r, w.shape[0], w.shape[1])


def conv_winograd4(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(4x4, 3x3); input 1 may be pre-packed by ``pack_winograd4``.

    Tiles are laid out channels-last, so the 36 GEMMs are (tiles, C) @ (C, M): with the
    (large, cold) filters as the right-hand operand OpenBLAS runs them 10-25% faster here
    than (M, C) @ (C, tiles), and gathering tiles copies whole channel vectors.
    """
    packed = _winograd_weights(inputs, attrs, winograd_ok, pack_winograd4)
    if packed is None:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    x, b = inputs[0], inputs[2] if len(inputs) > 2 else None
    n, c, height, width = x.shape
    win = window.geometry(attrs, (height, width), (3, 3))
    th, tw = -(-win.out[0] // 4), -(-win.out[1] // 4)
    dtype = np.result_type(x, packed)
    y = np.empty((n, packed.shape[2], *win.out), dtype=dtype)
    for image in range(n):
        v = _wino4_input(x[image], win, th, tw, dtype)
        prod = scratch("wino4.prod", (36, th * tw, packed.shape[2]), dtype)
        np.matmul(v, packed, out=prod)
        _wino4_output(prod, th, tw, b, y[image], fused_bounds(attrs))
    return [y.astype(x.dtype, copy=False)]


def _tiles_channels_last(
    x: np.ndarray, win: window.Window, th: int, tw: int, size: int, dtype: np.dtype
) -> np.ndarray:
    """(C, H, W) image -> its size x size input tiles, one every 4 pixels, channels last, as
    (size, size, th, tw, C): [a, b, ti, tj] = padded image[4ti + a, 4tj + b], one gathering copy.
    Both Winograd forms that read tiles share these scratch buffers (never in flight together)."""
    c, height, width = x.shape
    padded_h, padded_w = 4 * th + size - 4, 4 * tw + size - 4
    xp = zeroed("wino4.x", (padded_h, padded_w, c), dtype)
    pt, pl = win.pads_begin
    rows = slice(max(0, -pt), min(height, padded_h - pt))
    cols = slice(max(0, -pl), min(width, padded_w - pl))
    target = xp[rows.start + pt : rows.stop + pt, cols.start + pl : cols.stop + pl]
    np.copyto(target, x[:, rows, cols].transpose(1, 2, 0))
    sh, sw, sc = xp.strides
    tiles = scratch("wino4.d", (size, size, th, tw, c), dtype)
    np.copyto(tiles, np.lib.stride_tricks.as_strided(xp, tiles.shape, (sh, sw, 4 * sh, 4 * sw, sc)))
    return tiles


def _wino4_input(x: np.ndarray, win: window.Window, th: int, tw: int, dtype: np.dtype) -> np.ndarray:
    """(C, H, W) image -> V = B^T d B over all tiles, as (36, th*tw, C)."""
    c = x.shape[0]
    tiles = _tiles_channels_last(x, win, th, tw, 6, dtype)
    bt = _WINO4_BT.astype(dtype)
    rows_t = scratch("wino4.t", (6, 6, th * tw * c), dtype)
    np.matmul(bt, tiles.reshape(6, -1), out=rows_t.reshape(6, -1))
    v = scratch("wino4.v", (6, 6, th * tw * c), dtype)
    np.matmul(bt, rows_t, out=v)  # batched over the transformed row index
    return v.reshape(36, th * tw, c)


def _wino4_output(
    prod: np.ndarray, th: int, tw: int, b: np.ndarray | None, y: np.ndarray, bounds: tuple[Any, Any] | None
) -> None:
    """(36, th*tw, M) tile products -> A^T m A written (cropped, plus bias, clipped to
    ``bounds`` if given) into y (M, Ho, Wo)."""
    m = prod.shape[2]
    at = _WINO4_AT.astype(prod.dtype)
    rows = scratch("wino4.o1", (4, 6, th * tw * m), prod.dtype)
    np.matmul(at, prod.reshape(6, -1), out=rows.reshape(4, -1))
    out = scratch("wino4.o2", (4, 4, th * tw, m), prod.dtype)
    np.matmul(at, rows, out=out.reshape(4, 4, -1))
    if b is not None:  # along the contiguous channel axis: cheaper than on the NCHW output
        out += b.astype(prod.dtype, copy=False)
    # (i, j, ti, tj, M) -> channels-last image (4ti+i, 4tj+j, M) -> cropped NCHW: two copies
    # with contiguous inner runs beat one 5-D scatter into y
    hwc = scratch("wino4.hwc", (th, 4, tw, 4, m), prod.dtype)
    np.copyto(hwc, out.reshape(4, 4, th, tw, m).transpose(2, 0, 3, 1, 4))
    height, width = y.shape[1:]
    image = hwc.reshape(4 * th, 4 * tw, m)[:height, :width].transpose(2, 0, 1)
    if bounds is None:
        np.copyto(y, image)
    else:
        inplace.clip_into(image, *bounds, y)


conv_winograd4.fuses_clip = True  # type: ignore[attr-defined]
conv_winograd4.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_winograd4(inputs[1])} if winograd4_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


# Stride-2 3x3 conv as four stride-1 polyphase sub-convolutions (kernel taps at even/odd
# rows x even/odd columns: 2x2, 1x2, 2x1 and 1x1), the 2-tap directions by Winograd F(2, 2)
# (3 products for 2 outputs).  A 2x2 output tile then takes 25 products per channel pair
# instead of 36.  The direct (1-tap) directions sit in Winograd slots 0 and 2, which the
# output transform A^T = [[1, 1, 0], [0, 1, 1]] passes through unchanged, so each of the 3x3
# slots is one GEMM over the sub-convolutions that reach it (K = 4C at the corners, 2C on the
# edges, C in the centre).
_F22_G = np.array([[1, 0], [1, 1], [0, 1]], dtype=np.float64)


def winograd_s2_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    return (
        len(x_shape) == 4
        and tuple(w_shape[2:]) == (3, 3)
        and int(attrs.get("group", 1)) == 1
        and list(attrs.get("strides") or [1, 1]) == [2, 2]
        and all(d == 1 for d in (attrs.get("dilations") or [1, 1]))
    )


def pack_winograd_s2(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) weights -> (25*C, M): the right-hand sides of the 3x3 slot GEMMs, stacked
    as 4 corners (K = 4C), 4 edges (2C) and the centre (C), in the order the kernel's V has.
    G only adds pairs of weights, so the weights' own dtype is exact enough (and a float64
    copy of ResNet's 512x256 filters would be a 26 MB transient at load)."""
    g = _F22_G.astype(w.dtype)
    u00 = np.einsum("ik,mckl,jl->ijmc", g, w[:, :, 0::2, 0::2], g)  # even rows, even columns
    u10 = np.einsum("jl,mcl->jmc", g, w[:, :, 1, 0::2])  # kernel row 1: columns by Winograd
    u01 = np.einsum("ik,mck->imc", g, w[:, :, 0::2, 1])  # kernel column 1: rows by Winograd
    blocks = [part for a in (0, 2) for b in (0, 2) for part in (u00[a, b], u10[b], u01[a], w[:, :, 1, 1])]
    blocks += [part for a in (0, 2) for part in (u00[a, 1], u10[1])]
    blocks += [part for b in (0, 2) for part in (u00[1, b], u01[1])]
    blocks.append(u00[1, 1])
    c = w.shape[1]
    packed = np.empty((len(blocks) * c, w.shape[0]), dtype=w.dtype)
    for index, block in enumerate(blocks):
        packed[index * c : (index + 1) * c] = block.T
    return packed


def conv_winograd_s2(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-2 conv by polyphase Winograd (above); input 1 may be pre-packed by
    ``pack_winograd_s2``.  Channels last, so the slot GEMMs are (tiles, K) @ (K, M)."""
    packed = _winograd_weights(inputs, attrs, winograd_s2_ok, pack_winograd_s2)
    if packed is None:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    x, b = inputs[0], inputs[2] if len(inputs) > 2 else None
    n, c, height, width = x.shape
    win = window.geometry(attrs, (height, width), (3, 3))
    th, tw = -(-win.out[0] // 2), -(-win.out[1] // 2)
    dtype = np.result_type(x, packed)
    y = np.empty((n, packed.shape[1], *win.out), dtype=dtype)
    bias = None if b is None else b.astype(dtype, copy=False)
    for image in range(n):
        corners, edges, centre = _wino_s2_input(x[image], win, th, tw, dtype)
        prod = _wino_s2_products(corners, edges, centre, packed)
        _wino_s2_output(prod, th, tw, bias, y[image], fused_bounds(attrs))
    return [y.astype(x.dtype, copy=False)]


def _wino_s2_input(
    x: np.ndarray, win: window.Window, th: int, tw: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, H, W) image -> the slot operands: corners (4, T, 4C), edges (4, T, 2C), centre (T, C)."""
    c = x.shape[0]
    # d[r, s] = the 5x5 input tile element (r, s) of every tile, (th, tw, C) each; one gathering
    # copy makes every operand below a contiguous slab.  F(4x4)'s scratch purposes from here on:
    # the two never run at once, and the search runs both on the same layers, so buffers of
    # their own would only add to the peak RSS
    d = _tiles_channels_last(x, win, th, tw, 5, dtype)
    corners = scratch("wino4.t", (2, 2, th, tw, 4, c), dtype)  # [a/2, b/2, ..., part]
    edges = scratch("wino4.v", (4, th, tw, 2, c), dtype)  # (0,1), (2,1), (1,0), (1,2)
    rows_t = scratch("wino4.o1", (2, 3, th, tw, c), dtype)  # B^T rows 0 and 2 of the even taps
    np.subtract(d[0::4, 0::2], d[2, 0::2], out=rows_t)
    # even taps (2x2 kernel): B^T d B; row 1 of B^T d is d[2] itself
    np.subtract(rows_t[:, 0::2], rows_t[:, 1:2], out=corners[..., 0, :])
    np.copyto(edges[0:2, ..., 0, :], rows_t[:, 1])
    np.subtract(d[2, 0::4], d[2, 2], out=edges[2:4, ..., 0, :])
    # kernel row 1 (odd input rows): output rows direct, columns by Winograd
    np.subtract(d[1::2, 0::4], d[1::2, 2:3], out=corners[..., 1, :])
    np.copyto(edges[0:2, ..., 1, :], d[1::2, 2])
    # kernel column 1 (odd input columns): columns direct, rows by Winograd
    np.subtract(d[0::4, 1::2], d[2:3, 1::2], out=corners[..., 2, :])
    np.copyto(edges[2:4, ..., 1, :], d[2, 1::2])
    np.copyto(corners[..., 3, :], d[1::2, 1::2])  # the centre tap, direct both ways
    tiles = th * tw
    return corners.reshape(4, tiles, 4 * c), edges.reshape(4, tiles, 2 * c), d[2, 2].reshape(tiles, c)


def _wino_s2_products(
    corners: np.ndarray, edges: np.ndarray, centre: np.ndarray, packed: np.ndarray
) -> np.ndarray:
    """The 9 slot products as (9, T, M), ordered: 4 corners, 4 edges, centre."""
    c, tiles, m = centre.shape[1], centre.shape[0], packed.shape[1]
    prod = scratch("wino4.prod", (9, tiles, m), corners.dtype)
    np.matmul(corners, packed[: 16 * c].reshape(4, 4 * c, m), out=prod[0:4])
    np.matmul(edges, packed[16 * c : 24 * c].reshape(4, 2 * c, m), out=prod[4:8])
    np.matmul(centre, packed[24 * c :], out=prod[8])
    return prod


def _wino_s2_output(
    prod: np.ndarray, th: int, tw: int, bias: np.ndarray | None, y: np.ndarray, bounds: tuple[Any, Any] | None
) -> None:
    """A^T P A per tile into y (M, Ho, Wo), cropped, plus bias, clipped to ``bounds`` if given."""
    m = prod.shape[2]
    corner = prod[0:4].reshape(2, 2, th, tw, m)  # [a/2, b/2]
    edge = prod[4:8].reshape(4, th, tw, m)
    centre = prod[8].reshape(th, tw, m)
    if bias is not None:  # every output sums the centre slot exactly once
        centre += bias
    rows = scratch("wino4.o2", (2, 3, th, tw, m), prod.dtype)  # A^T over a: [i, b]
    np.add(corner[0], edge[2:4], out=rows[0, 0::2])
    np.add(edge[2:4], corner[1], out=rows[1, 0::2])
    np.add(edge[0:2], centre, out=rows[:, 1])
    hwc = scratch("wino4.hwc", (th, 2, tw, 2, m), prod.dtype)
    np.add(rows[:, 0:2], rows[:, 1:3], out=hwc.transpose(1, 3, 0, 2, 4))
    height, width = y.shape[1:]
    image = hwc.reshape(2 * th, 2 * tw, m)[:height, :width].transpose(2, 0, 1)
    if bounds is None:
        np.copyto(y, image)
    else:
        inplace.clip_into(image, *bounds, y)


conv_winograd_s2.fuses_clip = True  # type: ignore[attr-defined]
conv_winograd_s2.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_winograd_s2(inputs[1])} if winograd_s2_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


def _patches_ok(x: np.ndarray, w: np.ndarray, group: int, win: window.Window) -> bool:
    return (
        x.ndim == 4
        and group == 1
        and win.kernel == win.strides
        and not win.padded
        and all(d == 1 for d in win.dilations)
    )


def conv_patches(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A conv whose windows tile the image without overlap (kernel == stride, no padding: a
    vision transformer's patch embedding): the columns are the image's own blocks, so one
    transposing copy gathers them and one (M, K) @ (K, L) GEMM writes NCHW directly.
    Measured on ViT-Tiny's 16x16/16 embedding: 0.65 ms against im2col's 1.29 ms."""
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _patches_ok(x, w, group, win):
        return conv_im2col(inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (oh, ow), m = win.kernel, win.out, w.shape[0]
    dtype = np.result_type(x, w)
    cols = scratch("patches.cols", (n, c, kh, kw, oh, ow), dtype)
    blocks = x[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw)
    np.copyto(cols, blocks.transpose(0, 1, 3, 5, 2, 4))
    y = np.matmul(w.reshape(m, c * kh * kw).astype(dtype, copy=False), cols.reshape(n, c * kh * kw, oh * ow))
    if b is not None:
        y += b.astype(dtype, copy=False)[:, None]
    return [y.reshape(n, m, oh, ow).astype(x.dtype, copy=False)]


def conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    """Every Conv variant that can run these shapes, the selector's pick first."""
    x_shape, w_shape = shapes[0], shapes[1]
    first = select_conv(attrs, shapes)
    found = [first]
    if x_shape is None or w_shape is None or len(x_shape) != 4:
        return found
    group = int(attrs.get("group", 1))
    if first is conv_1x1 and len(shapes) > 2 and shapes[2] is not None and group == 1:
        found.append(conv_1x1_bias_row)
    if first is conv_im2col and any(s > 1 for s in (attrs.get("strides") or [1, 1])):
        found.append(conv_im2col_flat)  # at stride 1 it saves little and computes junk columns
        if group == 1:
            found.append(conv_im2col_phased)
    if first is conv_im2col and list(attrs.get("strides") or [1, 1]) == list(w_shape[2:]) and group == 1:
        found.append(conv_patches)  # each variant re-checks padding and falls back to im2col
    if first is conv_depthwise_flat:
        found.append(conv_depthwise_nhwc)
    if group == 1 and winograd_ok(x_shape, w_shape, attrs):
        found.append(conv_winograd)
    if group == 1 and winograd4_ok(x_shape, w_shape, attrs):
        found.append(conv_winograd4)
    if group == 1 and winograd_s2_ok(x_shape, w_shape, attrs):
        found.append(conv_winograd_s2)
    return found
