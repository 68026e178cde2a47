"""A 1x1 expansion and the 3x3 depthwise conv reading it, run band by band (numba).

MobileNet-style blocks widen 16-32 channels to 96-192 with a 1x1 conv, then filter each channel
with a 3x3 depthwise conv.  Run one after the other, the wide tensor between them goes out to
memory and comes back: 4.8 MB at MobileNetV2's 112x112 block, where a core's L2 holds 0.5-1 MB.
Measured on one Zen 4 core, those convs took 1.4-2x longer with their data out of cache than in
it, and a model's early layers run that way.  Here the expansion fills a buffer of a few image
rows (``BAND_BYTES``), the depthwise conv consumes it while it is still in L2, and the buffer
slides down the image: the rows the next band shares with this one are moved to its front, so no
row is expanded twice.  Both halves are the kernels the unfused plan runs (gemm_jit's tiles,
depthwise_vec_jit's rows), called on row ranges, so results are the unfused results bit for bit.

The planner fuses a pair (``engine/fuse_expand.py``) only where the search chose those two
kernels and the wide tensor is larger than a band would gain from (``MIN_WIDE_BYTES``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import types

from engine import jit
from engine.ops.conv import depthwise_vec_jit, gemm_conv_jit
from engine.ops.conv.common import NodeMemo, aligned_empty
from engine.ops.conv.gemm_jit import _gemm_items, address
from engine.ops.fused import with_activation

# A band's expanded rows: well inside a core's L2 (0.5 MB on Zen 3, 1-2 MB on Zen 4 and
# Cascade Lake), with room for the input rows and the depthwise output streaming past.
BAND_BYTES = 393216
# Below this the wide tensor stays in cache between the two kernels (L3 here) and bands gained
# nothing: in MobileNetV2 on one Zen 4 core the 4.8 MB pair (112x112, 96 channels) took 0.72x
# its unfused time, the 1.8 MB ones (56x56, 144) 1.13x and 1.01x (per-node medians, 40 runs).
MIN_WIDE_BYTES = 4 << 20

_F32, _I64, _BOOL = types.float32, types.int64, types.boolean
_IN = jit.array(_F32, 1, "C", readonly=True)
_OUT = jit.array(_F32, 1, "C")
_BANDS = types.void(
    _IN,  # x: flat channels-last input
    _IN,  # packed expansion weights (gemm_jit panels)
    _IN,  # expansion bias over whole panels
    _BOOL,
    _F32,
    _F32,  # expansion clip: on, low, high
    _OUT,  # band buffer (written by the expansion)
    _IN,  # the same buffer, read by the depthwise rows
    _IN,
    _IN,
    _IN,  # depthwise taps (9 * C), bias, zeros
    _OUT,  # flat channels-last output
    _BOOL,
    _F32,
    _F32,  # depthwise clip: on, low, high
    *(_I64,) * 14,
)


@jit.njit([_BANDS])
def _bands(
    x,
    packed,
    bias_e,
    clip_e,
    lo_e,
    hi_e,
    buf,
    view,
    taps,
    bias_d,
    zero,
    out,
    clip_d,
    lo_d,
    hi_d,
    images,
    height,
    width,
    cin,
    cexp,
    ho,
    wo,
    sh,
    sw,
    pt,
    pl,
    band,
    block_rows,
    panels,
):  # noqa: ANN001, ANN202
    """Every image's output rows in bands of ``band`` rows: expand the input rows a band reads
    that the buffer lacks (after moving the rows it shares with the last band to the front),
    then run the depthwise rows on the buffer, its first row standing for image row ``b0``."""
    line = width * cexp
    plane_in, plane_out = height * width * cin, ho * wo * cexp
    for n in range(images):
        b0, b1 = 0, 0  # image rows [b0, b1) are in the buffer
        for o0 in range(0, ho, band):
            o1 = min(ho, o0 + band)
            need0 = max(0, o0 * sh - pt)
            need1 = min(height, (o1 - 1) * sh - pt + 3)
            if b0 <= need0 < b1:  # slide: keep the shared rows
                if need0 > b0:
                    keep = (b1 - need0) * line
                    start = (need0 - b0) * line
                    for i in range(keep):
                        buf[i] = buf[start + i]
                b0 = need0
            else:
                b0, b1 = need0, need0
            if need1 > b1:
                rows = (need1 - b1) * width
                xo = n * plane_in + b1 * width * cin
                bo = (b1 - b0) * line
                items = ((rows + block_rows - 1) // block_rows) * panels
                _gemm_items(
                    x[xo : xo + rows * cin], packed, buf[bo : bo + rows * cexp], bias_e, zero,
                    False, clip_e, lo_e, hi_e, rows, cin, cexp, 0, block_rows, 0, items,
                )  # fmt: skip
                b1 = need1
            oo = n * plane_out
            depthwise_vec_jit._rows(
                view, taps, bias_d, out[oo : oo + plane_out], zero, zero, False, clip_d, lo_d, hi_d,
                b1 - b0, width, cexp, ho, wo, sh, sw, pt + b0, pl, o0, o1,
            )  # fmt: skip


def pack_expansion(w: np.ndarray) -> np.ndarray:
    """The 1x1 expansion's (M, C, 1, 1) filter in the GEMM's 32-wide panels."""
    return gemm_conv_jit.pack_pointwise(w)


def band_rows(width: int, channels: int, stride: int) -> int:
    """Output rows per band: as many as keep the band's expanded rows within ``BAND_BYTES``."""
    rows_in = max(3, BAND_BYTES // (width * channels * 4))
    return max(1, (rows_in - 3) // stride + 1)


_MEMO = NodeMemo()
# the two kernels one after the other, each with its node's activation (FusedConv's or none)
_EXPAND = with_activation(gemm_conv_jit.conv_1x1_gemm)
_DEPTHWISE = with_activation(depthwise_vec_jit.conv_depthwise_jit_vec)


def expand_depthwise(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs [x, expansion weights (packed by gemm_conv_jit.pack_pointwise, or (M, C, 1, 1)),
    expansion bias, depthwise weights (M, 1, 3, 3), depthwise bias]; attrs {"expand": the 1x1
    conv's attrs, "depthwise": the depthwise conv's}: the depthwise conv's output, channels
    last, as the two convs would give it.  Shapes the band kernel does not take run the two
    kernels one after the other."""
    x, w_e, b_e, w_d, b_d = inputs
    found = _MEMO.get(attrs, (w_e, b_e, w_d, b_d), x, lambda: _setup(x, w_e, b_e, w_d, b_d, attrs))
    if found is None:
        wide = _EXPAND([x, w_e, b_e], attrs["expand"])[0]
        return _DEPTHWISE([wide, w_d, b_d], attrs["depthwise"])
    expand, depthwise, geometry, shape, band = found
    weights, vector, (clip_e, lo_e, hi_e), _, _, blocks, _, _ = expand
    taps, bias_d, clip_d, lo_d, hi_d, dw_geometry, _ = depthwise
    height, width, cexp, ho, wo, sh, sw, pt, pl = dw_geometry
    buf = np.empty(((band - 1) * sh + 3) * width * cexp, np.float32)
    view = buf.view()
    view.flags.writeable = False
    out = aligned_empty(shape, np.float32, address)
    pixels = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # free for a channels-last view
    _bands(
        pixels.reshape(-1), weights, vector, clip_e, lo_e, hi_e, buf, view, taps, bias_d,
        depthwise_vec_jit._ZEROS, out.reshape(-1), clip_d, lo_d, hi_d,
        x.shape[0], height, width, x.shape[1], cexp, ho, wo, sh, sw, pt, pl, band, blocks[0],
        len(vector) // gemm_conv_jit.NR,
    )  # fmt: skip
    return [out.transpose(0, 3, 1, 2)]


def _setup(
    x: np.ndarray,
    w_e: np.ndarray,
    b_e: np.ndarray | None,
    w_d: np.ndarray,
    b_d: np.ndarray | None,
    attrs: dict[str, Any],
) -> tuple | None:
    expand = gemm_conv_jit._pointwise_setup(x, w_e, b_e, attrs["expand"])
    if expand is None or expand[3] != (1, 1):
        return None
    n, ho, wo, m = expand[4]
    wide = np.broadcast_to(np.zeros((), np.float32), (n, m, ho, wo))
    depthwise = depthwise_vec_jit._setup(wide, w_d, b_d, attrs["depthwise"])
    if depthwise is None:
        return None
    geometry = depthwise[5]
    band = band_rows(wo, m, geometry[5])
    return expand, depthwise, geometry, depthwise[6], band
