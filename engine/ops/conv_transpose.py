"""ConvTranspose as GEMM + col2im: one matmul per batch slice, then one strided add per kernel tap.

For each group, columns = W_g^T (M/g*K, C/g) @ X_g (C/g, P) give every input pixel's
contribution to every kernel tap; tap ``t`` of input pixel ``i`` lands on output position
``i * stride + t * dilation - pad_begin``.  The pads crop, output_padding and an explicit
output_shape only decide which of those positions exist, so each tap's slab is clipped to the
output up front and added with a single strided slice: no padded canvas, no crop copy.

Padding follows onnxruntime where it and onnx's ReferenceEvaluator disagree (see
``_resolve``): an explicit output_shape replaces the pads (the reference keeps them), and
auto_pad SAME never pads negatively (the reference zero-extends to input * stride).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ops.conv import COLUMN_BUDGET_BYTES, PING
from engine.ops.registry import check, register
from engine.ops.scratch import scratch
from engine.ops.window import AUTO_PADS


@dataclass(frozen=True)
class Geometry:
    """The resolved output size and leading crop along each spatial axis."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    out: tuple[int, ...]


@check("ConvTranspose")
def check_conv_transpose(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        return f"ConvTranspose auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}"
    return None


@register("ConvTranspose")
def conv_transpose(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w, b, group = _operands(inputs, attrs)
    spatial = tuple(x.shape[2:])
    geo = geometry(attrs, spatial, tuple(w.shape[2:]))
    # float16 accumulates in float32 (the tap sums would lose digits), cast back at the end
    dtype = np.promote_types(np.result_type(x, w), np.float32)
    n, c = x.shape[:2]
    mg, k, p = w.shape[1], math.prod(geo.kernel), math.prod(spatial)
    # (C, M/g, k...) -> per group (M/g*K, C/g) as a transposed view: BLAS reads it as is
    wt = w.reshape(group, c // group, mg * k).transpose(0, 2, 1).astype(dtype, copy=False)
    y = np.zeros((n, group, mg, *geo.out), dtype=dtype)
    chunk = max(1, COLUMN_BUDGET_BYTES // max(mg * group * k * p * dtype.itemsize, 1))
    for start in range(0, n, chunk):
        part = x[start : start + chunk]
        xs = part.reshape(len(part), group, c // group, p).astype(dtype, copy=False)
        cols = scratch(PING, (len(part), group, mg * k, p), dtype)
        np.matmul(wt, xs, out=cols)
        _col2im(cols.reshape(len(part), group, mg, k, *spatial), y[start : start + chunk], geo)
    if b is not None:
        y += b.astype(dtype, copy=False).reshape(group, mg, *([1] * len(spatial)))
    return [y.reshape(n, group * mg, *geo.out).astype(x.dtype, copy=False)]


def _operands(
    inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """X, W, B and group, after checking their shapes agree (W is (C, M/group, k...))."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    group = int(attrs.get("group", 1))
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"ConvTranspose needs X and W of the same rank >= 3, got X{x.shape} W{w.shape}")
    if x.dtype.kind != "f" or w.dtype.kind != "f":
        raise ValueError(f"ConvTranspose takes float tensors, got X {x.dtype} and W {w.dtype}")
    if group < 1 or x.shape[1] % group:
        raise ValueError(f"X has {x.shape[1]} channels, which group={group} does not divide")
    if w.shape[0] != x.shape[1]:
        raise ValueError(
            f"W{w.shape} is laid out (C, M/group, k...) for C={w.shape[0]} input channels, "
            f"but X{x.shape} has {x.shape[1]} channels"
        )
    kernel_shape = attrs.get("kernel_shape")
    if kernel_shape and tuple(kernel_shape) != tuple(w.shape[2:]):
        raise ValueError(f"kernel_shape {list(kernel_shape)} does not match W{w.shape}")
    if b is not None and b.shape != (w.shape[1] * group,):
        raise ValueError(f"bias B{b.shape} must have shape ({w.shape[1] * group},): M = W.shape[1] * group")
    return x, w, b, group


def geometry(attrs: dict[str, Any], spatial: tuple[int, ...], kernel: tuple[int, ...]) -> Geometry:
    """Resolve strides, dilations, pads / auto_pad / output_shape and output_padding per axis."""
    nd = len(spatial)
    strides = _ints(attrs, "strides", [1] * nd, nd)
    dilations = _ints(attrs, "dilations", [1] * nd, nd)
    pads = _ints(attrs, "pads", [0] * (2 * nd), 2 * nd)
    extra = _ints(attrs, "output_padding", [0] * nd, nd)
    output_shape = attrs.get("output_shape")
    if output_shape is not None:
        output_shape = _ints(attrs, "output_shape", [], nd)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad {auto_pad!r} is not one of {AUTO_PADS}")
    if min(strides + dilations, default=1) < 1 or min(pads + extra, default=0) < 0:
        raise ValueError(
            f"strides {strides} and dilations {dilations} must be >= 1, "
            f"pads {pads} and output_padding {extra} >= 0"
        )
    begin, out = [], []
    for i in range(nd):
        if extra[i] >= max(strides[i], dilations[i]):
            # the spec's rule: onnxruntime and the reference go further and refuse extra >= stride
            # (their shape checks), though the meaning is plain: zero cells past the last tap
            raise ValueError(
                f"output_padding {extra} must be less than the stride {strides[i]} "
                f"or the dilation {dilations[i]} on spatial axis {i}"
            )
        wanted = None if output_shape is None else output_shape[i]
        b, size = _resolve(
            spatial[i], kernel[i], strides[i], dilations[i], extra[i], pads[i], pads[nd + i], auto_pad, wanted
        )
        if size < 1:
            raise ValueError(
                f"the output would be empty along spatial axis {i} (input size {spatial[i]}, pads {pads}, "
                f"output_shape {output_shape})"
            )
        begin.append(b)
        out.append(size)
    return Geometry(tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(out))


def _ints(attrs: dict[str, Any], name: str, default: list[int], length: int) -> list[int]:
    value = attrs.get(name)
    values = default if value is None else [int(v) for v in value]
    if len(values) != length:
        raise ValueError(f"{name} {values} must have {length} values for this input's spatial rank")
    return values


def _resolve(
    size: int,
    kernel: int,
    stride: int,
    dilation: int,
    extra: int,
    pad_begin: int,
    pad_end: int,
    auto_pad: str,
    wanted: int | None,
) -> tuple[int, int]:
    """(leading crop, output size) along one axis.

    ``full`` is the uncropped output: stride * (size - 1) + dilated kernel + output_padding.
    An explicit output_shape ignores pads and crops ``full - wanted`` split as the spec says
    (the odd cell at the end for SAME_UPPER, at the beginning otherwise), as onnxruntime does;
    the reference evaluator keeps the pads instead.  A wanted size above ``full`` zero-extends
    the end by at most stride - 1 cells, onnxruntime's limit (beyond it, it and the reference
    refuse the input as inconsistent).  SAME_* aims at size * stride with the same split, but
    where ``full`` falls short (kernel extent below the stride) onnxruntime keeps ``full``
    while the reference zero-pads: we follow onnxruntime.
    """
    extent = (kernel - 1) * dilation + 1
    full = stride * (size - 1) + extent + extra
    if wanted is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = size * stride if wanted is None else wanted
        largest = max(full, full - extra + stride - 1)
        if wanted is not None and wanted > largest:
            raise ValueError(
                f"output_shape {wanted} is larger than input size {size} can give "
                f"(at most {largest} with this kernel, stride and output_padding)"
            )
        total = max(0, full - target)
        small = total // 2
        begin = small if auto_pad == "SAME_UPPER" else total - small
        return begin, (target if wanted is not None else full - total)
    if auto_pad == "VALID":
        return 0, full
    return pad_begin, full - pad_begin - pad_end


def _col2im(cols: np.ndarray, y: np.ndarray, geo: Geometry) -> None:
    """Add each kernel tap's slab (N, g, M/g, *spatial) of ``cols`` (N, g, M/g, K, *spatial)
    into the output positions it reaches in ``y`` (N, g, M/g, *out)."""
    spatial = cols.shape[4:]
    lead = (slice(None),) * 3
    for tap, index in enumerate(taps(geo.kernel)):
        slices = _tap_slices(index, spatial, geo)
        if slices is None:
            continue  # this tap only reaches cropped positions
        src, dst = slices
        y[(*lead, *dst)] += cols[(*lead, tap, *src)]


def _tap_slices(
    index: Sequence[int], spatial: Sequence[int], geo: Geometry
) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """The input pixels whose tap ``index`` lands inside the output, and where they land."""
    src, dst = [], []
    for t, size, stride, dilation, begin, out in zip(
        index, spatial, geo.strides, geo.dilations, geo.pads_begin, geo.out, strict=True
    ):
        offset = t * dilation - begin  # input pixel i lands on i * stride + offset
        first = max(0, -(offset // stride))  # ceil(-offset / stride)
        last = min(size - 1, (out - 1 - offset) // stride)
        if last < first:
            return None
        src.append(slice(first, last + 1))
        dst.append(slice(first * stride + offset, last * stride + offset + 1, stride))
    return tuple(src), tuple(dst)


def taps(kernel: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Kernel tap indices in W's (row-major) order."""
    return itertools.product(*(range(k) for k in kernel))
