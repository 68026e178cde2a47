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

from collections.abc import Sequence
from typing import Any

import numpy as np

# the kernels and helpers live by algorithm; their names stay importable from engine.ops.conv
from engine.ops.conv.common import (  # noqa: F401
    COLUMN_BUDGET_BYTES,
    PING,
    PONG,
    THIRD,
    _channels_last_copy,
    _channels_last_view,
    _check_residual,
    _clipped_fallback,
    _epilogue,
    _finish,
    _flat_phases,
    _in_batches,
    _padded_channels_last,
    _prepare,
    _Result,
    fused_bounds,
    residual_of,
)
from engine.ops.conv.depthwise import (  # noqa: F401
    _depthwise_ok,
    conv_depthwise,
    conv_depthwise_flat,
    conv_depthwise_nhwc,
)
from engine.ops.conv.direct import (  # noqa: F401
    _conv_1x1_channels_last,
    _patches_ok,
    _pointwise_channels_last,
    conv_1x1,
    conv_1x1_bias_row,
    conv_patches,
)
from engine.ops.conv.im2col import (  # noqa: F401
    HWC_MIN_CHANNELS,
    conv_im2col,
    conv_im2col_hwc,
    conv_im2col_phased,
    hwc_ok,
    pack_im2col_hwc,
)
from engine.ops.conv.winograd import (  # noqa: F401
    _F22_G,
    _WINO4_AT,
    _WINO4_BT,
    _WINO4_G,
    _WINO_AT,
    _WINO_BT,
    _WINO_G,
    WINO4_MIN_TILES,
    _by_column,
    _pack_transformed,
    _padded_image,
    _tiles_channels_last,
    _wino_input,
    _wino_output,
    _wino_s2_input,
    _wino_s2_output,
    _wino_s2_products,
    _winograd_channels_last,
    _winograd_setup,
    _winograd_weights,
    conv_winograd,
    conv_winograd4,
    conv_winograd_rows,
    conv_winograd_s2,
    pack_winograd,
    pack_winograd4,
    pack_winograd_rows,
    pack_winograd_s2,
    winograd4_ok,
    winograd_ok,
    winograd_rows_ok,
    winograd_s2_ok,
)
from engine.ops.registry import Kernel, register, selector


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
