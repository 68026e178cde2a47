"""Winograd F(2x2, 3x3) and F(4x4, 3x3) with their slot products on the JIT GEMM (gemm_jit.py).

The numpy forms (winograd.py) spend most of their time in the 16 or 36 slot GEMMs,
(tiles, C) @ (C, M) each, as one batched np.matmul: OpenBLAS packs every slot's filters on every
call.  Here the transformed filters are packed once per plan into the micro-kernel's panels and
the slots run as one JIT call (spread over threads by slot, block of tiles and panel).  The input
and output transforms are JIT passes too (winograd_tiles_jit.py): from the padded channels-last
image straight to the slots, and from the products straight to the channels-last output with
bias, residual and Relu / Clip applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv.common import (
    PING,
    PONG,
    _clipped_fallback,
    aligned_empty,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.gemm8_jit import gemm_batched16, pack_panels16
from engine.ops.conv.gemm_jit import address, gemm_batched, pack_panels
from engine.ops.conv.im2col import conv_im2col
from engine.ops.conv.pointwise_jit import residual_rows
from engine.ops.conv.winograd import (
    _padded_image,
    pack_winograd,
    pack_winograd4,
    winograd4_ok,
    winograd_ok,
)
from engine.ops.conv.winograd_tiles_jit import transform_input, transform_output
from engine.ops.registry import Kernel
from engine.ops.scratch import scratch


def _panels(slots: np.ndarray, pack: Callable[[np.ndarray], np.ndarray] = pack_panels) -> np.ndarray:
    """(S, C, M) slot filters -> (S, panels, C + 2, 32 or 16): each slot packed for the
    micro-kernel (``pack``: gemm_jit's 32-wide panels or gemm8_jit's 16-wide ones)."""
    return np.ascontiguousarray(np.stack([pack(slot) for slot in slots]))


def pack_winograd_gemm(w: np.ndarray) -> np.ndarray:
    return _panels(pack_winograd(w))


def pack_winograd4_gemm(w: np.ndarray) -> np.ndarray:
    return _panels(pack_winograd4(w))


def pack_winograd_gemm8(w: np.ndarray) -> np.ndarray:
    return _panels(pack_winograd(w), pack_panels16)


def pack_winograd4_gemm8(w: np.ndarray) -> np.ndarray:
    return _panels(pack_winograd4(w), pack_panels16)


def _winograd(
    inputs: list[np.ndarray | None],
    attrs: dict[str, Any],
    ok: Callable[[tuple[int, ...], tuple[int, ...], dict[str, Any]], bool],
    pack: Callable[[np.ndarray], np.ndarray],
    step: int,
    batched: Callable[[np.ndarray, np.ndarray, np.ndarray], None] = gemm_batched,
) -> list[np.ndarray]:
    """Winograd F(step x step, 3x3) with the slot GEMMs on the JIT micro-kernel (``batched``:
    gemm_jit's or gemm8_jit's) between the JIT tile transforms; input 1 may be pre-packed by
    ``pack`` (4-D: the (M, C, 3, 3) filters)."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    residual = residual_of(inputs)
    packed = tuple(w.shape[2:]) != (3, 3)  # (S, panels, C + 2, 32 or 16), not (M, C, 3, 3)
    plain = x.dtype == np.float32 and w.dtype == np.float32 and (b is None or b.dtype == np.float32)
    m = int(w[0, 0, -1, 0]) if packed else w.shape[0]
    w_shape = (m, w.shape[2] - 2, 3, 3) if packed else w.shape
    if not (plain and x.ndim == 4 and x.shape[1] == w_shape[1] and ok(x.shape, w_shape, attrs)) or (
        residual is not None and residual.dtype != np.float32
    ):
        if packed:  # the plan packs per input shapes: other shapes never get these filters
            raise ValueError(f"Winograd filters packed for other shapes than X{x.shape} {x.dtype}")
        return _clipped_fallback(conv_im2col, inputs, attrs)
    weights = w if packed else pack(w)
    win = window.geometry(attrs, tuple(x.shape[2:]), (3, 3))
    (n, c), (ho, wo), size = x.shape[:2], win.out, step + 2
    th, tw = -(-ho // step), -(-wo // step)
    out = aligned_empty((n, ho, wo, m), np.float32, address)  # channels last
    rows = None if residual is None else residual_rows(residual, (n, m, ho, wo)).reshape(n, ho, wo, m)
    bias = np.zeros(m, np.float32) if b is None else np.ascontiguousarray(b, np.float32)
    bounds = fused_bounds(attrs)
    for image in range(n):
        xp = _padded_image(x[image], win, step * th + 2, step * tw + 2, np.dtype(np.float32))
        v = scratch(PING, (size * size, th * tw, c), np.float32)
        transform_input(xp, v, step, th, tw)
        prod = scratch(PONG, (size * size, th * tw, m), np.float32)  # over the padded image, now read
        batched(v, weights, prod)
        residual_image = None if rows is None else rows[image]
        transform_output(prod, out[image], bias, residual_image, bounds, step, th, tw)
    return [out.transpose(0, 3, 1, 2)]


def conv_winograd_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(2x2, 3x3), slot products on the JIT GEMM."""
    return _winograd(inputs, attrs, winograd_ok, pack_winograd_gemm, 2)


def conv_winograd4_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(4x4, 3x3), slot products on the JIT GEMM."""
    return _winograd(inputs, attrs, winograd4_ok, pack_winograd4_gemm, 4)


def conv_winograd_gemm8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """conv_winograd_gemm on gemm8_jit's 8-lane (AVX2) tiles."""
    return _winograd(inputs, attrs, winograd_ok, pack_winograd_gemm8, 2, gemm_batched16)


def conv_winograd4_gemm8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """conv_winograd4_gemm on gemm8_jit's 8-lane (AVX2) tiles."""
    return _winograd(inputs, attrs, winograd4_ok, pack_winograd4_gemm8, 4, gemm_batched16)


for _kernel, _ok, _pack in (
    (conv_winograd_gemm, winograd_ok, pack_winograd_gemm),
    (conv_winograd4_gemm, winograd4_ok, pack_winograd4_gemm),
    (conv_winograd_gemm8, winograd_ok, pack_winograd_gemm8),
    (conv_winograd4_gemm8, winograd4_ok, pack_winograd4_gemm8),
):
    _kernel.fuses_clip = True  # type: ignore[attr-defined]
    _kernel.jit = True  # type: ignore[attr-defined]
    _kernel.pack = (  # type: ignore[attr-defined]
        lambda inputs, attrs, ok=_ok, pack=_pack: (
            {1: pack(inputs[1])} if ok(inputs[0].shape, inputs[1].shape, attrs) else {}
        )
    )


def _conv_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None or len(shapes[1]) != 4:
        return []
    found = []
    if winograd_ok(shapes[0], shapes[1], attrs) and shapes[0][1] == shapes[1][1]:
        found += [conv_winograd_gemm, conv_winograd_gemm8]
        if winograd4_ok(shapes[0], shapes[1], attrs):
            found += [conv_winograd4_gemm, conv_winograd4_gemm8]
    return found


CANDIDATES = {"Conv": _conv_candidates}
