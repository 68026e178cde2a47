"""What every Conv kernel shares: argument checks, the bias/residual/clip epilogue, channels-last
results, the shared scratch purposes, and the padded / phase-split copies of the input."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.ops import inplace, window
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch

COLUMN_BUDGET_BYTES = 64 * 1024 * 1024

# Every kernel here takes its work buffers from two shared scratch purposes (a third where a
# step needs three at once), each step reading one and writing the other: the next conv then
# reuses memory still in cache, where a buffer per purpose and kernel left most of them cold
# (writing to cold memory doubled the cost of Winograd's transforms) and added to the peak RSS.
PING, PONG, THIRD = "conv.ping", "conv.pong", "conv.third"


# Bytes of alignment for the JIT kernels' channels-last outputs: numpy's own arrays start 16
# bytes into a cache line, so every 16-lane load or store of them spans two lines (MobileNetV2's
# 144-channel 56x56 depthwise conv took 0.17 ms on numpy's alignment, 0.10 on a cache line's).
ALIGN = 64


def aligned_empty(
    shape: tuple[int, ...],
    dtype: np.dtype | type = np.float32,
    address: Callable[[np.ndarray], int] | None = None,
) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on an ALIGN-byte boundary (a view of a slightly larger
    buffer, which owns it); ``address`` finds a buffer's address faster than ``ctypes`` (0.8 us)
    where the caller has one (a JIT function)."""
    dtype = np.dtype(dtype)
    raw = np.empty(math.prod(shape) * dtype.itemsize + ALIGN, np.uint8)
    return np.ndarray(shape, dtype, raw, -(raw.ctypes.data if address is None else address(raw)) % ALIGN)


class NodeMemo:
    """What a JIT kernel derives from a node's constants (packed taps, geometry, clip bounds),
    kept per node: keyed on the identity of the node's attrs and weight arrays (a plan's, fixed
    for its life; the memo holds them, so an id is never reused) and the input's shape and dtype.
    Deriving it took ~8 us a call (window.geometry, the checks, a taps copy), as much as the
    whole computation of a 7x7 MobileNetV2 layer."""

    LIMIT = 1024  # entries, then start over (a process running many models)

    def __init__(self) -> None:
        self._found: dict[tuple, tuple] = {}

    def get(self, attrs: dict[str, Any], arrays: tuple, x: np.ndarray, make: Callable[[], Any]) -> Any:
        key = (id(attrs), *map(id, arrays), x.shape, x.dtype)
        hit = self._found.get(key)
        if hit is not None and hit[0] is attrs and all(a is b for a, b in zip(hit[1], arrays, strict=True)):
            return hit[2]
        value = make()
        if len(self._found) >= self.LIMIT:
            self._found.clear()
        self._found[key] = (attrs, arrays, value)
        return value


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


def clip_floats(bounds: tuple[Any, Any] | None) -> tuple[bool, np.float32, np.float32]:
    """``fused_bounds``'s result as the JIT epilogues take it: (whether to clip, low, high), an
    open side as -inf / inf."""
    low, high = (None, None) if bounds is None else bounds
    lo = np.float32(-np.inf if low is None else low)
    return bounds is not None, lo, np.float32(np.inf if high is None else high)


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


def _channels_last_view(x: np.ndarray) -> bool:
    """Whether a 4-D (N, C, H, W) value lies channels last in memory (a channels-last kernel's
    result, see _Result)."""
    return (
        x.ndim == 4
        and x.shape[1] > 1
        and x.strides[1] == x.itemsize
        and x.strides[3] >= x.shape[1] * x.itemsize
    )


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
