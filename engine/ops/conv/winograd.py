"""Winograd 3x3 Conv kernels on one channels-last pipeline: F(2x2, 3x3), F(4x4, 3x3), row-only
F(2, 3) for small images, and stride 2 over polyphase parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv.common import (
    PING,
    PONG,
    THIRD,
    _check_residual,
    _clipped_fallback,
    _Result,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.im2col import conv_im2col
from engine.ops.scratch import scratch

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
    xp = scratch(PONG, (padded_h, padded_w, c), dtype)
    pt, pl = win.pads_begin
    rows = slice(max(0, -pt), min(height, padded_h - pt))
    cols = slice(max(0, -pl), min(width, padded_w - pl))
    top, bottom, left, right = rows.start + pt, rows.stop + pt, cols.start + pl, cols.stop + pl
    np.copyto(xp[top:bottom, left:right], x[:, rows, cols].transpose(1, 2, 0))
    # only the border is zeroed: filling the whole buffer first wrote the image's bytes twice
    xp[:top] = 0
    xp[bottom:] = 0
    xp[top:bottom, :left] = 0
    xp[top:bottom, right:] = 0
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
