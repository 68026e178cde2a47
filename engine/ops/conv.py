"""Conv: im2col + matmul in general, a direct matmul for 1x1 kernels, tap sums for depthwise.

The planner picks the variant once per input-shape signature (``select_conv``), or the
kernel search (engine/search.py) measures the candidates of ``conv_candidates``: im2col
over exact phase windows for strided convs and over a channels-last copy for wide inputs,
the bias as a GEMM column for 1x1, Winograd F(2x2, 3x3) and F(4x4, 3x3) for 3x3 stride 1
(F(2, 3) along the rows on small images), polyphase Winograd for 3x3 stride 2, depthwise in
two layouts.  Every variant checks its own precondition and falls back to im2col, so a stale
choice is only slower, never wrong.

A FusedConv may pass a fourth input, the residual: every kernel adds it (exactly the output's
shape) to its result before the fused Relu / Clip, so a ResNet or MobileNet skip connection
costs no Add node (nor a Relu node after it).  The kernels that compute channels last return
their result as a transposed view of a channels-last array (``_Result``), and the 1x1 and
depthwise kernels keep a channels-last input channels last: a chain of such convs makes no
transposing copies between its layers.
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

# Every kernel here takes its work buffers from two shared scratch purposes (a third where a
# step needs three at once), each step reading one and writing the other: the next conv then
# reuses memory still in cache, where a buffer per purpose and kernel left most of them cold
# (writing to cold memory doubled the cost of Winograd's transforms) and added to the peak RSS.
PING, PONG, THIRD = "conv.ping", "conv.pong", "conv.third"


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


def _finish(
    y: np.ndarray, b: np.ndarray | None, win: window.Window, dtype: np.dtype, residual: np.ndarray | None
) -> np.ndarray:
    """(N, M, P) or (N, g, M/g, P) -> (N, M, *out), plus bias and residual."""
    y = y.reshape(y.shape[0], -1, *win.out)
    if b is not None:
        y += b.reshape(1, -1, *([1] * len(win.out)))
    return _epilogue(y, residual, None).astype(dtype, copy=False)


def residual_of(inputs: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """A FusedConv's residual (input 3), or None."""
    return inputs[3] if len(inputs) > 3 else None


def _check_residual(residual: np.ndarray, shape: tuple[int, ...]) -> None:
    if residual.shape != tuple(shape):
        raise ValueError(f"FusedConv residual {residual.shape} must have the output's shape {tuple(shape)}")


def _epilogue(y: np.ndarray, residual: np.ndarray | None, bounds: tuple[Any, Any] | None) -> np.ndarray:
    """y + residual, then clipped to ``bounds``, in place on y (a fresh array)."""
    if residual is not None:
        _check_residual(residual, y.shape)
        y += _channels_last_copy(residual) if _channels_last_view(y) else residual
    if bounds is not None:
        inplace.clip_into(y, *bounds, y)
    return y


def _channels_last_copy(residual: np.ndarray) -> np.ndarray:
    """The residual laid out channels last, as a channels-last result it is added to: numpy adds
    mismatched layouts element by element at a large stride, 1.6-8x slower than this copy and
    a contiguous add (512x7x7: 99 us against 13)."""
    if _channels_last_view(residual):
        return residual
    n, c, height, width = residual.shape
    copy = scratch(THIRD, (n, height, width, c), residual.dtype)  # the kernel's steps are done
    np.copyto(copy, residual.transpose(0, 2, 3, 1))
    return copy.transpose(0, 3, 1, 2)


# The channels-last kernels (Winograd, channels-last im2col and depthwise, 1x1 on a channels-last
# input) leave their result channels last: the NCHW value they return is a transposed view of a
# fresh (N, H, W, C) array, so no transposing copy back to NCHW is made, and the next such
# kernel reads its input with a plain copy (ResNet18 and MobileNetV2 ~4% faster).  numpy keeps
# every other consumer right whatever the strides.
class _Result:
    """A kernel's output computed as channels-last images (Hp, Wp, C), cropped to ``out``."""

    def __init__(
        self, n: int, m: int, out: tuple[int, int], padded: tuple[int, int], dtype: np.dtype
    ) -> None:
        self.out = out
        self.buffer = np.empty((n, *padded, m), dtype)

    def finish(self, residual: np.ndarray | None, bounds: tuple[Any, Any] | None) -> np.ndarray:
        """The (N, C, H, W) view, plus the residual, clipped to ``bounds`` (on the contiguous
        buffer when there is no residual, where numpy's loops are fastest)."""
        if residual is None and bounds is not None:
            inplace.clip_into(self.buffer, *bounds, self.buffer)
        height, width = self.out
        y = self.buffer[:, :height, :width].transpose(0, 3, 1, 2)
        return y if residual is None else _epilogue(y, residual, bounds)


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
    y = fallback(inputs, attrs)[0]  # the fallback adds the residual
    bounds = fused_bounds(attrs)
    if bounds is not None:
        inplace.clip_into(y, *bounds, y)
    return [y]


def _in_batches(
    kernel: Kernel, inputs: list[np.ndarray | None], attrs: dict[str, Any], per_image: int
) -> list[np.ndarray]:
    """``kernel`` over slices of the batch whose work buffers stay within COLUMN_BUDGET_BYTES:
    scratch buffers live as long as the thread, so one sized for a whole large batch would
    keep hundreds of MB.  A residual is sliced along with the input."""
    x, chunk = inputs[0], max(1, COLUMN_BUDGET_BYTES // max(per_image, 1))
    residual = residual_of(inputs)
    if residual is not None:
        _check_residual(residual, (len(x), *residual.shape[1:]))

    def part(start: int) -> list[np.ndarray | None]:
        rest = [] if residual is None else [residual[start : start + chunk]]
        return [x[start : start + chunk], *inputs[1:3], *rest]

    return [np.concatenate([kernel(part(start), attrs)[0] for start in range(0, len(x), chunk)])]


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
        cols = scratch(PING, (part.shape[0], c, k, *win.out), dtype)
        np.stack([part[(slice(None), slice(None), *sl)] for _, sl in window.taps(win)], axis=2, out=cols)
        cols = cols.reshape(part.shape[0], group, (c // group) * k, p)
        np.matmul(wmat, cols, out=y[start : start + chunk])
    return [_finish(y, b, win, x.dtype, residual_of(inputs))]


def conv_1x1(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group, win = _prepare(inputs, attrs)
    if any(k != 1 for k in win.kernel):
        return conv_im2col(inputs, attrs)
    if _pointwise_channels_last(x, w.shape[0], group, win):
        return [_conv_1x1_channels_last(x, w, b, win, residual_of(inputs))]
    n, c = x.shape[:2]
    m = w.shape[0]
    _, sl = next(window.taps(win))
    xs = window.pad(x, win)[(slice(None), slice(None), *sl)]
    xs = xs.reshape(n, group, c // group, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, c // group), xs)
    return [_finish(y, b, win, x.dtype, residual_of(inputs))]


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
    return [_finish(y, b, win, x.dtype, residual_of(inputs))]


# -- variants the planner measures per node (engine/search.py) -----------------------------------


def _flat_phases(x: np.ndarray, win: window.Window) -> tuple[np.ndarray, int, int]:
    """The zero-padded 2-D input split into stride x stride phases, each row-flattened.

    Returns (phases (sh*sw, N, C, hph*wph), hph, wph): output (r, q) of tap (i, j) reads
    phase ((i*dh) % sh, (j*dw) % sw) at flat index (r + i*dh // sh) * wph + q + j*dw // sw,
    so every tap is one contiguous slice covering all outputs (plus wph - Wo junk columns
    per row, which the caller drops), or an exact (Ho, Wo) window of the phase.
    """
    n, c, height, width = x.shape
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    pt, pl = win.pads_begin
    hph, wph = ho + (kh - 1) * dh // sh + 1, wo + (kw - 1) * dw // sw
    phases = scratch(PONG, (sh * sw, n, c, hph, wph), np.result_type(x))
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


def conv_im2col_phased(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Strided 2-D im2col whose columns are copied from the ``_flat_phases`` split as exact
    (Ho, Wo) windows: no junk columns, so the GEMM writes the output directly (bias as a
    row of ones under the columns) and a fused Relu / Clip (``fuses_clip``) is one
    contiguous pass in place.  Measured on ResNet's 7x7/2 stem: 3.2-3.5 ms against 3.9-4.3
    for whole flat rows with junk columns cropped after the GEMM (a variant now removed)."""
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
    cols = scratch(PING, (n, depth + (b is not None), ho * wo), dtype)
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
    return [_epilogue(y, residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]


conv_im2col_phased.fuses_clip = True  # type: ignore[attr-defined]


# Below this many input channels the channels-last columns' inner runs are too short to pay
# for the transposing copy (ResNet's 3-channel stem: 5.0 ms against 3.4 for exact phases).
HWC_MIN_CHANNELS = 16


def hwc_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    return len(x_shape) == 4 and len(w_shape) == 4 and int(attrs.get("group", 1)) == 1


def pack_im2col_hwc(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) weights -> (M, kh*kw*C): tap-major rows, the order of the columns below."""
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(w.shape[0], -1)


def conv_im2col_hwc(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """2-D im2col over a channels-last copy of the input; input 1 may be pre-packed by
    ``pack_im2col_hwc`` (then ``kernel_shape`` must be given).  Each (output pixel, tap) run of
    the columns is a whole channel vector, so one strided copy with contiguous inner runs
    gathers them: on ResNet's 7x7, 512-channel layers the NCHW taps copy 7 floats at a time
    (0.24 ms against 0.03).  Then (M, K) @ columns^T writes NCHW; bias and a fused Relu / Clip
    (``fuses_clip``) follow on the output."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if w.ndim == 4:
        if not hwc_ok(x.shape, w.shape, attrs):
            return _clipped_fallback(conv_im2col, inputs, attrs)
        x, w, b, _, win = _prepare(inputs, attrs)
        w = pack_im2col_hwc(w)
    else:
        win = window.geometry(attrs, tuple(x.shape[2:]), tuple(attrs["kernel_shape"]))
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = win.kernel, win.strides, win.dilations, win.out
    m, depth = w.shape[0], kh * kw * c
    dtype = np.result_type(x, w)
    per_image = depth * ho * wo * dtype.itemsize
    if n > 1 and n * per_image > COLUMN_BUDGET_BYTES:
        known = {**attrs, "kernel_shape": list(win.kernel)}  # w is packed from here on
        return _in_batches(conv_im2col_hwc, [x, w, b, *inputs[3:]], known, per_image)
    xp = _padded_channels_last(x, win, dtype)
    s_n, s_h, s_w, s_c = xp.strides
    taps = np.lib.stride_tricks.as_strided(
        xp, (n, ho, wo, kh, kw, c), (s_n, sh * s_h, sw * s_w, dh * s_h, dw * s_w, s_c)
    )
    cols = scratch(PING, (n, ho, wo, kh, kw, c), dtype)
    np.copyto(cols, taps)
    # columns @ W^T leaves the result channels last, as the Winograd forms do; with fewer pixels
    # than half the filters OpenBLAS runs that GEMM slower than W @ columns^T (ResNet's 7x7,
    # 512-channel stage: 1.75 ms against 1.41), so those write NCHW
    if 2 * ho * wo >= m:
        result = _Result(n, m, (ho, wo), (ho, wo), dtype)
        np.matmul(cols.reshape(-1, depth), w.astype(dtype, copy=False).T, out=result.buffer.reshape(-1, m))
        if b is not None:
            result.buffer += b.astype(dtype, copy=False)
        return [result.finish(residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]
    y = np.empty((n, m, ho, wo), dtype=dtype)
    np.matmul(
        w.astype(dtype, copy=False),
        cols.reshape(n, ho * wo, depth).transpose(0, 2, 1),
        out=y.reshape(n, m, ho * wo),
    )
    if b is not None:
        y += b.astype(dtype, copy=False).reshape(m, 1, 1)
    return [_epilogue(y, residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]


conv_im2col_hwc.fuses_clip = True  # type: ignore[attr-defined]
conv_im2col_hwc.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_im2col_hwc(inputs[1])}
    if attrs.get("kernel_shape") and hwc_ok(inputs[0].shape, inputs[1].shape, attrs)
    else {}
)


def conv_1x1_bias_row(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """1x1 conv with the bias as one more GEMM column: [W | b] @ [X; 1].

    Copying the (small) input once is cheaper than a bias pass over the output when the
    output has many more channels than the input (MobileNet's expansion convs, 6x).
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if b is None or group != 1 or x.ndim < 3 or any(k != 1 for k in win.kernel) or win.padded:
        return conv_1x1(inputs, attrs)
    if _pointwise_channels_last(x, w.shape[0], group, win):
        return [_conv_1x1_channels_last(x, w, b, win, residual_of(inputs))]
    n, c = x.shape[:2]
    m, p = w.shape[0], math.prod(win.out)
    dtype = np.result_type(x, w, b)
    _, sl = next(window.taps(win))
    rows = scratch(PING, (n, c + 1, p), dtype)
    np.copyto(rows[:, :c].reshape(n, c, *win.out), x[(slice(None), slice(None), *sl)])
    rows[:, c] = 1
    weights = np.empty((m, c + 1), dtype=dtype)
    weights[:, :c] = w.reshape(m, c)
    weights[:, c] = b
    y = np.matmul(weights, rows).reshape(n, m, *win.out)
    return [_epilogue(y, residual_of(inputs), None).astype(x.dtype, copy=False)]


def _channels_last_view(x: np.ndarray) -> bool:
    """Whether a 4-D (N, C, H, W) value lies channels last in memory (a channels-last kernel's
    result, see _Result)."""
    return (
        x.ndim == 4
        and x.shape[1] > 1
        and x.strides[1] == x.itemsize
        and x.strides[3] >= x.shape[1] * x.itemsize
    )


def _pointwise_channels_last(x: np.ndarray, m: int, group: int, win: window.Window) -> bool:
    """Whether a 1x1 conv runs channels last: on a channels-last input, with enough pixels for
    the (pixels, C) @ (C, M) GEMM to be as fast as the NCHW one (see conv_im2col_hwc)."""
    wide = 2 * math.prod(win.out) >= m
    return group == 1 and wide and not win.padded and _channels_last_view(x)


def _conv_1x1_channels_last(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, win: window.Window, residual: np.ndarray | None
) -> np.ndarray:
    """A 1x1 conv of a channels-last input as (pixels, C) @ (C, M), its result left channels
    last too: transposing the input to NCHW and the output back would cost two copies."""
    n, c = x.shape[:2]
    m, (ho, wo) = w.shape[0], win.out
    dtype = np.result_type(x, w)
    _, sl = next(window.taps(win))
    pixels = x[(slice(None), slice(None), *sl)].transpose(0, 2, 3, 1)
    if not pixels.flags.c_contiguous or pixels.dtype != dtype:  # strided: gather whole channel runs
        gathered = scratch(PING, pixels.shape, dtype)
        np.copyto(gathered, pixels)
        pixels = gathered
    buffer = np.empty((n, ho, wo, m), dtype=dtype)
    np.matmul(pixels.reshape(-1, c), w.reshape(m, c).T.astype(dtype, copy=False), out=buffer.reshape(-1, m))
    if b is not None:
        buffer += b.astype(dtype, copy=False)
    return _epilogue(buffer.transpose(0, 3, 1, 2), residual, None).astype(x.dtype, copy=False)


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
    row per channel, so every tap is a contiguous slice covering the whole image (the
    columns past the output width are computed and dropped).  The taps of one kernel column
    that read the same phase sit a constant stride apart (one phase row), so one einsum
    sums them as fused multiply-adds: half the passes of multiply-then-add per tap (2x
    faster on MobileNetV2's layers).  Bias and a fused Relu / Clip (``fuses_clip``) follow
    on the cropped output.
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _depthwise_ok(x, w, group, win):
        return _clipped_fallback(conv_depthwise, inputs, attrs)
    if _channels_last_view(x):
        # splitting a channels-last input into NCHW phases is a transposing gather, 3-8x the
        # copy from NCHW (MobileNetV2's 112x112 layers: 1.07 ms against 0.14): the
        # channels-last form reads it with a plain copy instead
        return conv_depthwise_nhwc(inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (ho, wo) = win.kernel, win.strides, win.out
    dtype = np.result_type(x, w)
    flat, _, wph = _flat_phases(x.astype(dtype, copy=False), win)
    length = ho * wph
    wk = w.reshape(c, kh, kw).astype(dtype, copy=False)
    acc = scratch(PING, (n, c, length), dtype)
    tmp = scratch(THIRD, (n, c, length), dtype)
    groups = [(a, j) for a in range(min(sh, kh)) for j in range(kw)]
    for index, (a, j) in enumerate(groups):
        rows = range(a, kh, sh)  # the taps of column j in row phase a, one phase row apart
        start = flat[a * sw + j % sw, :, :, j // sw :]
        s_n, s_c, s_q = start.strides
        taps = np.lib.stride_tricks.as_strided(start, (n, c, len(rows), length), (s_n, s_c, wph * s_q, s_q))
        np.einsum("ncip,ci->ncp", taps, wk[:, a::sh, j], out=acc if index == 0 else tmp)
        if index:
            acc += tmp
    y = np.empty((n, c, ho, wo), dtype=dtype)
    cropped = acc.reshape(n, c, ho, wph)[:, :, :, :wo]
    if b is not None:
        np.add(cropped, b.reshape(1, c, 1, 1), out=y)
    else:
        np.copyto(y, cropped)
    return [_epilogue(y, residual_of(inputs), fused_bounds(attrs)).astype(x.dtype, copy=False)]


conv_depthwise_flat.fuses_clip = True  # type: ignore[attr-defined]


def conv_depthwise_nhwc(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Depthwise conv with channels last: one einsum sums all taps as fused multiply-adds
    whose inner loop runs over the channels (long for the late, small-image layers) with one
    weight vector per tap; 1.3-1.5x faster than a multiply and an add per tap.

    The input is transposed straight into a padded scratch image (only its border zeroed),
    and bias and a fused Relu / Clip (``fuses_clip``) run on the contiguous accumulator
    before the one transposing copy out.
    """
    x, w, b, group, win = _prepare(inputs, attrs)
    if not _depthwise_ok(x, w, group, win):
        return _clipped_fallback(conv_depthwise, inputs, attrs)
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (ho, wo) = win.kernel, win.strides, win.out
    dtype = np.result_type(x, w)
    xp = _padded_channels_last(x, win, dtype)
    s_n, s_h, s_w, s_c = xp.strides
    taps = np.lib.stride_tricks.as_strided(
        xp, (n, ho, wo, kh, kw, c), (s_n, sh * s_h, sw * s_w, s_h, s_w, s_c)
    )
    wk = np.ascontiguousarray(w.reshape(c, kh, kw).transpose(1, 2, 0), dtype=dtype)
    residual, bounds = residual_of(inputs), fused_bounds(attrs)
    if residual is not None:
        _check_residual(residual, (n, c, ho, wo))
    result = _Result(n, c, (ho, wo), (ho, wo), dtype)
    np.einsum("nhwijc,ijc->nhwc", taps, wk, out=result.buffer)
    if b is not None:
        result.buffer += b.astype(dtype, copy=False)
    return [result.finish(residual, bounds).astype(x.dtype, copy=False)]


conv_depthwise_nhwc.fuses_clip = True  # type: ignore[attr-defined]


def _padded_channels_last(x: np.ndarray, win: window.Window, dtype: np.dtype) -> np.ndarray:
    """(N, C, H, W) -> zero-padded (N, Hp, Wp, C) scratch; only the padding border is zeroed."""
    n, c, height, width = x.shape
    (pt, pl), (pb, pr) = win.pads_begin, win.pads_end
    xp = scratch(PONG, (n, height + pt + pb, width + pl + pr, c), dtype)
    xp[:, :pt] = 0
    xp[:, pt + height :] = 0
    xp[:, pt : pt + height, :pl] = 0
    xp[:, pt : pt + height, pl + width :] = 0
    np.copyto(xp[:, pt : pt + height, pl : pl + width], x.transpose(0, 2, 3, 1))
    return xp


# Winograd F(2x2, 3x3) (Lavin & Gray 2015): each 2x2 output tile from a 4x4 input tile with
# 16 multiplies per channel pair instead of 36, i.e. 2.25x fewer than direct convolution.
_WINO_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
_WINO_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
_WINO_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)


def winograd_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    return (
        len(x_shape) == 4
        and tuple(w_shape[2:]) == (3, 3)
        and int(attrs.get("group", 1)) == 1
        and all(s == 1 for s in (attrs.get("strides") or [1, 1]))
        and all(d == 1 for d in (attrs.get("dilations") or [1, 1]))
    )


def pack_winograd(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) weights -> U = G g G^T as (16, C, M), the right-hand side of the 16 GEMMs."""
    return np.ascontiguousarray(_pack_transformed(w, _WINO_G).transpose(0, 2, 1))


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


def _winograd_setup(
    inputs: list[np.ndarray | None],
    attrs: dict[str, Any],
    ok: Callable[[tuple[int, ...], tuple[int, ...], dict[str, Any]], bool],
    pack: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, window.Window] | None:
    """What every 3x3 Winograd kernel starts from: (packed filters, X, bias, geometry), or
    None when the shapes are not the kernel's (it falls back to im2col)."""
    packed = _winograd_weights(inputs, attrs, ok, pack)
    if packed is None:
        return None
    x, b = inputs[0], inputs[2] if len(inputs) > 2 else None
    return packed, x, b, window.geometry(attrs, tuple(x.shape[2:]), (3, 3))


def conv_winograd(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(2x2, 3x3); input 1 may be pre-packed by ``pack_winograd``.

    The channels-last form of ``conv_winograd4`` with 4x4 tiles: more products than F(4x4) but
    filters of 16/9 the original size instead of 4x, which wins where the 36 filter slots
    would not stay in cache (ResNet's 14x14, 256-channel stage)."""
    return _winograd_channels_last(inputs, attrs, winograd_ok, pack_winograd, _WINO_BT, _WINO_AT)


conv_winograd.fuses_clip = True  # type: ignore[attr-defined]
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
    """3x3 stride-1 conv by Winograd F(4x4, 3x3); input 1 may be pre-packed by ``pack_winograd4``."""
    return _winograd_channels_last(inputs, attrs, winograd4_ok, pack_winograd4, _WINO4_BT, _WINO4_AT)


def _winograd_channels_last(
    inputs: list[np.ndarray | None],
    attrs: dict[str, Any],
    ok: Callable[[tuple[int, ...], tuple[int, ...], dict[str, Any]], bool],
    pack: Callable[[np.ndarray], np.ndarray],
    bt: np.ndarray,
    at: np.ndarray,
) -> list[np.ndarray]:
    """Winograd F(s x s, 3x3) with input transform ``bt`` and output transform ``at`` (s rows).

    Tiles are laid out channels-last, so the slot GEMMs are (tiles, C) @ (C, M): with the
    (large, cold) filters as the right-hand operand OpenBLAS runs them 10-25% faster here
    than (M, C) @ (C, tiles), and gathering tiles copies whole channel vectors.  Every step
    reads one of two scratch buffers and writes the other (PING, PONG), so the working set
    stays small and mostly in cache: with a buffer per step, writing to cold memory doubled
    the cost of the transforms.
    """
    setup = _winograd_setup(inputs, attrs, ok, pack)
    if setup is None:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    packed, x, b, win = setup
    n = x.shape[0]
    step = at.shape[0]
    th, tw = -(-win.out[0] // step), -(-win.out[1] // step)
    dtype = np.result_type(x, packed)
    bt, at = bt.astype(dtype), at.astype(dtype)
    bias = None if b is None else b.astype(dtype, copy=False)
    m = packed.shape[2]
    residual, bounds = residual_of(inputs), fused_bounds(attrs)
    if residual is not None:
        _check_residual(residual, (n, m, *win.out))
    result = _Result(n, m, win.out, (step * th, step * tw), dtype)
    for image in range(n):
        v = _wino_input(x[image], win, th, tw, bt, step)
        prod = scratch(PONG, (bt.shape[0] ** 2, th * tw, m), dtype)
        np.matmul(v, packed, out=prod)
        _wino_output(prod, th, tw, at, bias, result.buffer[image])
    return [result.finish(residual, bounds).astype(x.dtype, copy=False)]


def _tiles_channels_last(
    x: np.ndarray, win: window.Window, th: int, tw: int, size: int, step: int, dtype: np.dtype, purpose: str
) -> np.ndarray:
    """(C, H, W) image -> its size x size input tiles, one every ``step`` pixels, channels last,
    as (size, size, th, tw, C) in scratch ``purpose``: [a, b, ti, tj] = padded image[step ti +
    a, step tj + b], one gathering copy.  The Winograd forms share the padded image's buffer
    (never in flight together)."""
    c = x.shape[0]
    xp = _padded_image(x, win, step * th + size - step, step * tw + size - step, dtype)
    sh, sw, sc = xp.strides
    tiles = scratch(purpose, (size, size, th, tw, c), dtype)
    np.copyto(tiles, np.lib.stride_tricks.as_strided(xp, tiles.shape, (sh, sw, step * sh, step * sw, sc)))
    return tiles


def _padded_image(
    x: np.ndarray, win: window.Window, padded_h: int, padded_w: int, dtype: np.dtype
) -> np.ndarray:
    """(C, H, W) image -> zero-padded channels-last (padded_h, padded_w, C) scratch, cropped or
    zero-extended at the end to that size."""
    c, height, width = x.shape
    xp = zeroed(PONG, (padded_h, padded_w, c), dtype)
    pt, pl = win.pads_begin
    rows = slice(max(0, -pt), min(height, padded_h - pt))
    cols = slice(max(0, -pl), min(width, padded_w - pl))
    target = xp[rows.start + pt : rows.stop + pt, cols.start + pl : cols.stop + pl]
    np.copyto(target, x[:, rows, cols].transpose(1, 2, 0))
    return xp


def _wino_input(x: np.ndarray, win: window.Window, th: int, tw: int, bt: np.ndarray, step: int) -> np.ndarray:
    """(C, H, W) image -> V = B^T d B over all tiles, as (size^2, th*tw, C)."""
    c, size = x.shape[0], bt.shape[0]
    tiles = _tiles_channels_last(x, win, th, tw, size, step, bt.dtype, PING)
    rows_t = scratch(PONG, (size, size, th * tw * c), bt.dtype)
    np.matmul(bt, _by_column(tiles.reshape(size, size, -1)), out=_by_column(rows_t))
    v = scratch(PING, (size, size, th * tw * c), bt.dtype)  # over the tiles, now read
    np.matmul(bt, rows_t, out=v)  # batched over the transformed row index
    return v.reshape(size * size, th * tw, c)


def _by_column(slots: np.ndarray) -> np.ndarray:
    """(rows, cols, L) slots as (cols, rows, L): a transform over the row index then runs as
    one GEMM per column, 2x faster here than one (rows, cols * L) GEMM on ResNet's 56x56 layers."""
    return slots.transpose(1, 0, 2)


def _wino_output(
    prod: np.ndarray,
    th: int,
    tw: int,
    at: np.ndarray,
    bias: np.ndarray | None,
    hwc: np.ndarray,
) -> None:
    """(size^2, th*tw, M) tile products -> A^T m A plus bias, written into the channels-last
    image hwc (s th, s tw, M)."""
    m, (step, size) = prod.shape[2], at.shape
    if bias is not None:  # A^T's column 1 is all ones: slot (1, 1) reaches every output once
        prod[size + 1] += bias
    rows = scratch(PING, (step, size, th * tw * m), prod.dtype)  # V is read by now
    np.matmul(at, _by_column(prod.reshape(size, size, -1)), out=_by_column(rows))
    out = scratch(PONG, (step, step, th * tw, m), prod.dtype)  # over the products, now read
    np.matmul(at, rows, out=out.reshape(step, step, -1))
    # (i, j, ti, tj, M) -> channels-last image (s ti + i, s tj + j, M)
    np.copyto(hwc.reshape(th, step, tw, step, m), out.reshape(step, step, th, tw, m).transpose(2, 0, 3, 1, 4))


conv_winograd4.fuses_clip = True  # type: ignore[attr-defined]
conv_winograd4.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_winograd4(inputs[1])} if winograd4_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
)


# Winograd F(2, 3) along the rows only: each 1x2 output tile from a 3x4 input patch, the
# columns by Winograd (4 products for 2 outputs) and the rows directly (K = 3C per slot
# GEMM).  Filters grow 4/3 instead of 16/9 or 4x, and each slot GEMM keeps Ho * Wo/2 rows:
# on ResNet's 7x7, 512-channel stage, where the 2-D forms' GEMMs are too thin for their
# filters, 3.1 ms against 3.3 for im2col.
def winograd_rows_ok(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> bool:
    return winograd_ok(x_shape, w_shape, attrs) and not winograd4_ok(x_shape, w_shape, attrs)


def pack_winograd_rows(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) weights -> (4, 3C, M): slot s holds G w along the kernel columns, rows
    ordered (kernel row, channel).  G only halves sums of weights: their own dtype is exact
    enough (a float64 copy of a 512x512 layer would be a 19 MB transient at load)."""
    u = np.einsum("sk,mcik->sicm", _WINO_G.astype(w.dtype), w)
    return np.ascontiguousarray(u).reshape(4, 3 * w.shape[1], w.shape[0])


def conv_winograd_rows(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(2, 3) along the rows; input 1 may be pre-packed by
    ``pack_winograd_rows``.  Channels last, two scratch buffers in turn, as the 2-D forms."""
    setup = _winograd_setup(inputs, attrs, winograd_ok, pack_winograd_rows)
    if setup is None:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    packed, x, b, win = setup
    n, c = x.shape[:2]
    (ho, wo), m = win.out, packed.shape[2]
    tw = -(-wo // 2)
    dtype = np.result_type(x, packed)
    bt, at = _WINO_BT.astype(dtype), _WINO_AT.astype(dtype)
    residual, bounds = residual_of(inputs), fused_bounds(attrs)
    if residual is not None:
        _check_residual(residual, (n, m, ho, wo))
    result = _Result(n, m, (ho, wo), (ho, 2 * tw), dtype)
    for image in range(n):
        xp = _padded_image(x[image], win, ho + 2, 2 * tw + 2, dtype)
        s_h, s_w, s_c = xp.strides
        patches = scratch(PING, (4, ho, tw, 3, c), dtype)  # [k, r, t, i] = xp[r + i, 2t + k]
        np.copyto(patches, np.lib.stride_tricks.as_strided(xp, patches.shape, (s_w, s_h, 2 * s_w, s_h, s_c)))
        v = scratch(PONG, (4, ho * tw, 3 * c), dtype)
        np.matmul(bt, patches.reshape(4, -1), out=v.reshape(4, -1))
        prod = scratch(PING, (4, ho * tw, m), dtype)  # the patches are read by now
        np.matmul(v, packed, out=prod)
        if b is not None:  # A^T's column 1 is all ones: slot 1 reaches every output once
            prod[1] += b.astype(dtype, copy=False)
        out = scratch(PONG, (2, ho, tw, m), dtype)
        np.matmul(at, prod.reshape(4, -1), out=out.reshape(2, -1))
        np.copyto(result.buffer[image].reshape(ho, tw, 2, m), out.transpose(1, 2, 0, 3))
    return [result.finish(residual, bounds).astype(x.dtype, copy=False)]


conv_winograd_rows.fuses_clip = True  # type: ignore[attr-defined]
conv_winograd_rows.pack = lambda inputs, attrs: (  # type: ignore[attr-defined]
    {1: pack_winograd_rows(inputs[1])} if winograd_rows_ok(inputs[0].shape, inputs[1].shape, attrs) else {}
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
    setup = _winograd_setup(inputs, attrs, winograd_s2_ok, pack_winograd_s2)
    if setup is None:
        return _clipped_fallback(conv_im2col, inputs, attrs)
    packed, x, b, win = setup
    n = x.shape[0]
    th, tw = -(-win.out[0] // 2), -(-win.out[1] // 2)
    dtype = np.result_type(x, packed)
    m = packed.shape[1]
    bias = None if b is None else b.astype(dtype, copy=False)
    residual, bounds = residual_of(inputs), fused_bounds(attrs)
    if residual is not None:
        _check_residual(residual, (n, m, *win.out))
    result = _Result(n, m, win.out, (2 * th, 2 * tw), dtype)
    for image in range(n):
        corners, edges, centre = _wino_s2_input(x[image], win, th, tw, dtype)
        prod = _wino_s2_products(corners, edges, centre, packed)
        _wino_s2_output(prod, th, tw, bias, result.buffer[image])
    return [result.finish(residual, bounds).astype(x.dtype, copy=False)]


def _wino_s2_input(
    x: np.ndarray, win: window.Window, th: int, tw: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, H, W) image -> the slot operands: corners (4, T, 4C), edges (4, T, 2C), centre (T, C)."""
    c = x.shape[0]
    # d[r, s] = the 5x5 input tile element (r, s) of every tile, (th, tw, C) each; one gathering
    # copy makes every operand below a contiguous slab.  The stride-1 forms' two scratch
    # buffers from here on (the centre operand stays in PING until the products are taken),
    # plus one for the corner and edge operands
    d = _tiles_channels_last(x, win, th, tw, 5, 4, dtype, PING)
    operands = scratch(THIRD, (24 * th * tw * c,), dtype)
    corners = operands[: 16 * th * tw * c].reshape(2, 2, th, tw, 4, c)  # [a/2, b/2, ..., part]
    edges = operands[16 * th * tw * c :].reshape(4, th, tw, 2, c)  # (0,1), (2,1), (1,0), (1,2)
    rows_t = scratch(PONG, (2, 3, th, tw, c), dtype)  # B^T rows 0 and 2 of the even taps
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
    prod = scratch(PONG, (9, tiles, m), corners.dtype)  # the input's PONG part is read by now
    np.matmul(corners, packed[: 16 * c].reshape(4, 4 * c, m), out=prod[0:4])
    np.matmul(edges, packed[16 * c : 24 * c].reshape(4, 2 * c, m), out=prod[4:8])
    np.matmul(centre, packed[24 * c :], out=prod[8])
    return prod


def _wino_s2_output(
    prod: np.ndarray,
    th: int,
    tw: int,
    bias: np.ndarray | None,
    hwc: np.ndarray,
) -> None:
    """A^T P A plus bias per tile into the channels-last image hwc (2 th, 2 tw, M)."""
    m = prod.shape[2]
    corner = prod[0:4].reshape(2, 2, th, tw, m)  # [a/2, b/2]
    edge = prod[4:8].reshape(4, th, tw, m)
    centre = prod[8].reshape(th, tw, m)
    if bias is not None:  # every output sums the centre slot exactly once
        centre += bias
    rows = scratch(PING, (2, 3, th, tw, m), prod.dtype)  # A^T over a: [i, b]
    np.add(corner[0], edge[2:4], out=rows[0, 0::2])
    np.add(edge[2:4], corner[1], out=rows[1, 0::2])
    np.add(edge[0:2], centre, out=rows[:, 1])
    np.add(rows[:, 0:2], rows[:, 1:3], out=hwc.reshape(th, 2, tw, 2, m).transpose(1, 3, 0, 2, 4))


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
    cols = scratch(PING, (n, c, kh, kw, oh, ow), dtype)
    blocks = x[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw)
    np.copyto(cols, blocks.transpose(0, 1, 3, 5, 2, 4))
    y = np.matmul(w.reshape(m, c * kh * kw).astype(dtype, copy=False), cols.reshape(n, c * kh * kw, oh * ow))
    if b is not None:
        y += b.astype(dtype, copy=False)[:, None]
    return [_epilogue(y.reshape(n, m, oh, ow), residual_of(inputs), None).astype(x.dtype, copy=False)]


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
    if first is conv_im2col:
        strided = any(s > 1 for s in (attrs.get("strides") or [1, 1]))
        if group == 1 and strided:
            found.append(conv_im2col_phased)
        if group == 1 and x_shape[1] >= HWC_MIN_CHANNELS:
            found.append(conv_im2col_hwc)
    if first is conv_im2col and list(attrs.get("strides") or [1, 1]) == list(w_shape[2:]) and group == 1:
        found.append(conv_patches)  # each variant re-checks padding and falls back to im2col
    if first is conv_depthwise_flat:
        found.append(conv_depthwise_nhwc)
    if group == 1 and winograd4_ok(x_shape, w_shape, attrs):
        found += [conv_winograd, conv_winograd4]
    elif group == 1 and winograd_rows_ok(x_shape, w_shape, attrs):
        # as fast as F(2x2) on ResNet's 7x7 stage, with filters 4/3 instead of 16/9 the size
        found.append(conv_winograd_rows)
    if group == 1 and winograd_s2_ok(x_shape, w_shape, attrs):
        found.append(conv_winograd_s2)
    return found
