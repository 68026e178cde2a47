"""Raster: the one data-movement primitive the converter lowers Transpose, Slice, Concat, Pad,
Expand, Gather (constant indices), Split and the reshape family into (MNN's "geometry computing").

attrs:

- ``shape``: the output's shape; ``dtype`` (optional): its dtype, else the first input's;
- ``regions``: a list of ``{"input", "src_offset", "src_strides", "dst_offset", "dst_strides",
  "size"}``.  Each copies a strided block of input ``input`` (a flat, C-order index space of that
  input: element ``src_offset + sum(k_i * src_strides[i])``) to the output's flat index
  ``dst_offset + sum(k_i * dst_strides[i])``, for every multi-index ``k`` within ``size``;
- ``fill`` (optional): the value of output elements no region writes (Pad).  Without it the
  regions must cover the whole output.

Every region is one vectorised copy between two strided views over the flat buffers (the
stride trick of ``as_strided``, built directly with ``np.ndarray(buffer=...)``: a tenth of the
overhead, and numpy checks the extent too); the source view is read-only.  Offsets and strides
are checked against the arrays' sizes first, so a bad region fails cleanly instead of reading
or writing outside a buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ops.common import tensor_attr
from engine.ops.registry import check, prepare, register

# Ops only the converter writes (not ONNX operators a user model may contain).
INTERNAL_OPS = frozenset({"Raster"})
REGION_KEYS = ("input", "src_offset", "src_strides", "dst_offset", "dst_strides", "size")


def extent(offset: int, strides: list[int], size: list[int]) -> tuple[int, int]:
    """The lowest and highest flat index a region touches (size must have no 0)."""
    low = high = offset
    for stride, count in zip(strides, size, strict=True):
        reach = stride * (count - 1)
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high


@check("Raster")
def check_raster(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
    shape, regions = attrs.get("shape"), attrs.get("regions")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return "Raster needs its output shape as a list of non-negative ints in attribute 'shape'"
    if not isinstance(regions, list) or n_outputs != 1:
        return "Raster needs a list of regions in attribute 'regions' and exactly one output"
    total = math.prod(shape)
    for region in regions:
        if not isinstance(region, dict) or any(key not in region for key in REGION_KEYS):
            return f"Raster region must have the keys {REGION_KEYS}"
        if not 0 <= int(region["input"]) < n_inputs:
            return f"Raster region reads input {region['input']}, the node has {n_inputs}"
        size = region["size"]
        if not len(size) == len(region["src_strides"]) == len(region["dst_strides"]):
            return "Raster region: size, src_strides and dst_strides must have the same length"
        if 0 in size:
            continue
        low, high = extent(int(region["dst_offset"]), region["dst_strides"], size)
        if low < 0 or high >= total:
            return f"Raster region writes outside the output (indices {low}..{high} of {total})"
    return None


def _fill(attrs: dict[str, Any], dtype: np.dtype) -> Any:
    fill = attrs["fill"]
    if isinstance(fill, dict):  # a tensor attribute
        return tensor_attr(fill).reshape(-1)[0]
    if isinstance(fill, str):  # "nan", "inf", "-inf": JSON has no such numbers
        return float(fill)
    return fill


@dataclass(frozen=True)
class Region:
    """One region with its numbers parsed and its extents worked out (once, at load)."""

    input: int
    size: tuple[int, ...]
    src_offset: int
    src_strides: tuple[int, ...]
    src_extent: tuple[int, int]
    dst_offset: int
    dst_strides: tuple[int, ...]
    dst_extent: tuple[int, int]

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Region:
        size = tuple(int(n) for n in raw["size"])
        src_offset, dst_offset = int(raw["src_offset"]), int(raw["dst_offset"])
        src_strides = tuple(int(s) for s in raw["src_strides"])
        dst_strides = tuple(int(s) for s in raw["dst_strides"])
        if not len(size) == len(src_strides) == len(dst_strides):
            raise ValueError("Raster region: size, src_strides and dst_strides must have the same length")
        empty = (0, -1)  # touches nothing: every bounds check passes
        return cls(
            int(raw["input"]),
            size,
            src_offset,
            src_strides,
            empty if 0 in size else extent(src_offset, list(src_strides), list(size)),
            dst_offset,
            dst_strides,
            empty if 0 in size else extent(dst_offset, list(dst_strides), list(size)),
        )


@prepare("Raster")
def prepare_raster(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> dict[str, Any]:
    """``compiled``: the regions parsed once, since parsing them per call was most of a small
    Raster's cost (a decode step's KV-cache concats); a malformed region is left for the
    node's check to report."""
    try:
        return {**attrs, "compiled": [Region.parse(raw) for raw in attrs["regions"]]}
    except (KeyError, TypeError, ValueError):
        return attrs


def compiled_regions(attrs: dict[str, Any]) -> list[Region]:
    compiled = attrs.get("compiled")
    return compiled if compiled is not None else [Region.parse(raw) for raw in attrs["regions"]]


def without_regions(attrs: dict[str, Any], drop: set[int]) -> dict[str, Any]:
    """The attrs with the regions at the positions in ``drop`` removed (raw and compiled alike)."""
    kept = {"regions": [r for i, r in enumerate(attrs["regions"]) if i not in drop]}
    if "compiled" in attrs:
        kept["compiled"] = [r for i, r in enumerate(attrs["compiled"]) if i not in drop]
    return {**attrs, **kept}


@register("Raster")
def raster(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    shape = [int(d) for d in attrs["shape"]]
    view = _as_view(inputs, shape, attrs)
    if view is not None:
        return [view]
    out = np.empty(math.prod(shape), _dtype(inputs, attrs))
    _write(inputs, attrs, out)
    return [out.reshape(shape)]


def raster_into(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Raster writing into a slice of a buffer made earlier (its last input) from element
    ``into_offset`` on, and returning that slice: the planner's way to let each part of a
    concatenation be written straight into the concatenation (a KV cache's per-layer concats
    into the stacked present state), and the concatenation itself then copy only the rest."""
    *rest, buffer = inputs
    shape = attrs["shape"]
    total, offset = math.prod(shape), int(attrs["into_offset"])
    flat = buffer.reshape(-1)
    if not buffer.flags.c_contiguous or not flat.flags.writeable or offset < 0 or offset + total > flat.size:
        raise ValueError(f"Raster cannot write {total} elements at {offset} into a buffer of {flat.size}")
    out = flat[offset : offset + total]
    if out.dtype != _dtype(rest, attrs):
        raise ValueError(f"Raster output is {_dtype(rest, attrs)}, its buffer {out.dtype}")
    _write(rest, attrs, out)
    return [out.reshape(shape)]


def allocate(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """An uninitialised buffer of ``shape`` and ``dtype`` (that ``raster_into`` nodes fill)."""
    return [np.empty([int(d) for d in attrs["shape"]], dtype=np.dtype(attrs["dtype"]))]


def _dtype(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> np.dtype:
    """The output's dtype: the attribute, else the first input's."""
    if attrs.get("dtype"):
        return np.dtype(attrs["dtype"])
    return next(x for x in inputs if x is not None).dtype


def _write(inputs: list[np.ndarray | None], attrs: dict[str, Any], out: np.ndarray) -> None:
    """The fill (if any), then every region of ``inputs``, into the flat ``out``."""
    regions = compiled_regions(attrs)
    if "fill" in attrs:
        out.fill(_fill(attrs, out.dtype))
    _copy_regions(_flat_sources(inputs, regions), regions, out)


def _flat_sources(inputs: list[np.ndarray | None], regions: list[Region]) -> list[np.ndarray | None]:
    """C-contiguous 1-D views of the inputs some region reads (a copy only when one is not
    contiguous); the copy path only ever reads them."""
    read = {region.input for region in regions}
    return [
        np.ascontiguousarray(x).reshape(-1) if x is not None and index in read else None
        for index, x in enumerate(inputs)
    ]


def _copy_regions(sources: list[np.ndarray | None], regions: list[Region], out: np.ndarray) -> None:
    """Copy every region from the flat sources into the flat output, bounds checked first."""
    dtype, total, itemsize = out.dtype, out.size, out.dtype.itemsize
    for region in regions:
        if 0 in region.size:
            continue
        src = sources[region.input]
        if src.dtype != dtype:
            raise ValueError(f"Raster input {region.input} is {src.dtype}, the output {dtype}")
        low, high = region.src_extent
        if low < 0 or high >= src.size:
            raise IndexError(f"Raster region reads indices {low}..{high} of an input of {src.size}")
        low, high = region.dst_extent
        if low < 0 or high >= total:
            raise IndexError(f"Raster region writes indices {low}..{high} of an output of {total}")
        # strided views straight over the flat buffers (what as_strided builds, without its
        # overhead, and numpy checks the extent once more)
        src_strides = tuple(s * itemsize for s in region.src_strides)
        dst_strides = tuple(s * itemsize for s in region.dst_strides)
        read = np.ndarray(region.size, dtype, src, region.src_offset * itemsize, src_strides)
        write = np.ndarray(region.size, dtype, out, region.dst_offset * itemsize, dst_strides)
        np.copyto(write, read, casting="no")


def _as_view(inputs: list[np.ndarray | None], shape: list[int], attrs: dict[str, Any]) -> np.ndarray | None:
    """The output as a read-only view of the input when the one region copies a contiguous
    block of a contiguous input (a slice or split along leading axes, a reshape): free.  A
    strided block (a transpose) is copied: measured, the kernels reading a strided view lose
    more than the copy costs.  None when a copy is needed."""
    if not may_view(attrs):
        return None
    region = compiled_regions(attrs)[0]
    x = inputs[region.input]
    total = math.prod(shape)
    if x is None:
        return None
    if attrs.get("dtype") and np.dtype(attrs["dtype"]) != x.dtype:
        return None
    low, high = region.src_extent
    if low < 0 or high >= x.size or not x.flags.c_contiguous:
        return None  # the copy path reports a bad region
    block = x.reshape(-1)[region.src_offset : region.src_offset + total]
    return _reshaped_view(block, shape)


def may_view(attrs: dict[str, Any]) -> bool:
    """Whether this Raster hands back a view of its input when that input is C-contiguous (and
    a copy otherwise): one region copying one contiguous block to the whole output."""
    regions = compiled_regions(attrs)
    if "fill" in attrs or len(regions) != 1:
        return False
    region, total = regions[0], math.prod(int(d) for d in attrs["shape"])
    return (
        total > 0
        and region.size == (total,)
        and region.src_strides == (1,)
        and region.dst_offset == 0
        and c_order(list(region.dst_strides), [total])
    )


def c_order(strides: list[int], size: list[int]) -> bool:
    """Whether ``strides`` walk a C-ordered block of ``size`` (dims of size 1 are free)."""
    expected = 1
    for stride, count in zip(reversed(strides), reversed(size), strict=True):
        if count != 1 and int(stride) != expected:
            return False
        expected *= count
    return True


def _reshaped_view(x: np.ndarray, shape: list[int]) -> np.ndarray | None:
    try:
        view = np.reshape(x, shape, copy=False)  # raises instead of copying
    except ValueError:
        return None
    if view is x:
        view = x.view()
    view.flags.writeable = False
    return view
