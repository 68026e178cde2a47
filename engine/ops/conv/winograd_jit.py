"""Winograd F(2x2, 3x3) and F(4x4, 3x3) with their slot products on the JIT GEMM (gemm_jit.py).

The numpy forms (winograd.py) spend most of their time in the 16 or 36 slot GEMMs,
(tiles, C) @ (C, M) each, as one batched np.matmul: OpenBLAS packs every slot's filters on every
call.  Here the transformed filters are packed once per plan into the micro-kernel's panels and
the slots run as one JIT call (spread over threads by slot, block of tiles and panel); the input
and output transforms are winograd.py's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.ops import window
from engine.ops.conv.common import (
    PONG,
    _check_residual,
    _clipped_fallback,
    _Result,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.gemm8_jit import gemm_batched16, pack_panels16
from engine.ops.conv.gemm_jit import gemm_batched, pack_panels
from engine.ops.conv.im2col import conv_im2col
from engine.ops.conv.winograd import (
    _WINO4_AT,
    _WINO4_BT,
    _WINO_AT,
    _WINO_BT,
    _wino_input,
    _wino_output,
    pack_winograd,
    pack_winograd4,
    winograd4_ok,
    winograd_ok,
)
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
    bt: np.ndarray,
    at: np.ndarray,
    batched: Callable[[np.ndarray, np.ndarray, np.ndarray], None] = gemm_batched,
) -> list[np.ndarray]:
    """winograd._winograd_channels_last with the slot GEMMs on the JIT micro-kernel (``batched``:
    gemm_jit's or gemm8_jit's); input 1 may be pre-packed by ``pack`` (4-D: the (M, C, 3, 3)
    filters)."""
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
    n, step = x.shape[0], at.shape[0]
    th, tw = -(-win.out[0] // step), -(-win.out[1] // step)
    bt32, at32 = bt.astype(np.float32), at.astype(np.float32)
    bounds = fused_bounds(attrs)
    if residual is not None:
        _check_residual(residual, (n, m, *win.out))
    result = _Result(n, m, win.out, (step * th, step * tw), np.dtype(np.float32))
    for image in range(n):
        v = _wino_input(x[image], win, th, tw, bt32, step)
        prod = scratch(PONG, (bt.shape[0] ** 2, th * tw, m), np.float32)
        batched(v, weights, prod)
        _wino_output(prod, th, tw, at32, b, result.buffer[image])
    return [result.finish(residual, bounds)]


def conv_winograd_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(2x2, 3x3), slot products on the JIT GEMM."""
    return _winograd(inputs, attrs, winograd_ok, pack_winograd_gemm, _WINO_BT, _WINO_AT)


def conv_winograd4_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """3x3 stride-1 conv by Winograd F(4x4, 3x3), slot products on the JIT GEMM."""
    return _winograd(inputs, attrs, winograd4_ok, pack_winograd4_gemm, _WINO4_BT, _WINO4_AT)


def conv_winograd_gemm8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """conv_winograd_gemm on gemm8_jit's 8-lane (AVX2) tiles."""
    return _winograd(inputs, attrs, winograd_ok, pack_winograd_gemm8, _WINO_BT, _WINO_AT, gemm_batched16)


def conv_winograd4_gemm8(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """conv_winograd4_gemm on gemm8_jit's 8-lane (AVX2) tiles."""
    return _winograd(inputs, attrs, winograd4_ok, pack_winograd4_gemm8, _WINO4_BT, _WINO4_AT, gemm_batched16)


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
