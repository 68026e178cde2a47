"""Sliding-window geometry shared by Conv and the pools: pads, strides, dilations, output size."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]  # includes any extra cells ceil_mode needs at the end
    out: tuple[int, ...]

    @property
    def padded(self) -> bool:
        return any(self.pads_begin) or any(self.pads_end)


def geometry(attrs: dict[str, Any], spatial: tuple[int, ...], kernel: tuple[int, ...]) -> Window:
    """Resolve auto_pad / pads / ceil_mode into explicit begin/end padding and the output size."""
    nd = len(spatial)
    strides = tuple(attrs.get("strides") or [1] * nd)
    dilations = tuple(attrs.get("dilations") or [1] * nd)
    pads = list(attrs.get("pads") or [0] * (2 * nd))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad {auto_pad!r} is not one of {AUTO_PADS}")
    if not len(strides) == len(dilations) == len(kernel) == nd or len(pads) != 2 * nd:
        raise ValueError(
            f"strides {strides}, dilations {dilations}, pads {pads} and kernel {kernel} "
            f"do not match {nd} spatial dims"
        )
    begin, end, out = [], [], []
    for i in range(nd):
        extent = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = -(-spatial[i] // strides[i])
            total = max(0, (size - 1) * strides[i] + extent - spatial[i])
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            b, e = 0, 0
            size = (spatial[i] - extent) // strides[i] + 1
        else:
            b, e = pads[i], pads[nd + i]
            size = _explicit_size(spatial[i] + b + e, extent, strides[i], attrs.get("ceil_mode", 0))
            if attrs.get("ceil_mode", 0) and (size - 1) * strides[i] >= spatial[i] + b:
                size -= 1  # the last window must start inside the input or its leading padding
            e += max(0, (size - 1) * strides[i] + extent - (spatial[i] + b + e))
        if size < 1:
            raise ValueError(f"the window (extent {extent}) does not fit spatial size {spatial[i]}")
        begin.append(b)
        end.append(e)
        out.append(size)
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def _explicit_size(padded: int, extent: int, stride: int, ceil_mode: int) -> int:
    if ceil_mode:
        return math.ceil((padded - extent) / stride) + 1
    return (padded - extent) // stride + 1


def pad(x: np.ndarray, win: Window, value: float | int = 0) -> np.ndarray:
    """x padded on its spatial axes (all but the first two)."""
    if not win.padded:
        return x
    widths = [(0, 0), (0, 0), *zip(win.pads_begin, win.pads_end, strict=True)]
    return np.pad(x, widths, mode="constant", constant_values=value)


def taps(win: Window) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For each kernel position, its index and the slices of the padded input it sees."""
    for index in itertools.product(*(range(k) for k in win.kernel)):
        slices = tuple(
            slice(i * d, i * d + (o - 1) * s + 1, s)
            for i, d, o, s in zip(index, win.dilations, win.out, win.strides, strict=True)
        )
        yield index, slices
