"""Weight storage precision.  Only fp16 storage exists so far; int8/int4 are refused honestly."""

from __future__ import annotations

import numpy as np

from converter.errors import ConversionError
from converter.translate import FerryGraph

QUANTIZE_MODES = (None, "fp16")
PLANNED_MODES = ("int8", "int4")
FP16_MAX = float(np.finfo(np.float16).max)


def check_options(quantize: str | None, block_size: int) -> None:
    if quantize in PLANNED_MODES:
        raise ConversionError(
            f"quantize={quantize!r} is not supported yet; use quantize=None (float32) or 'fp16'"
        )
    if quantize not in QUANTIZE_MODES:
        raise ConversionError(f"quantize={quantize!r} is not a known mode; use None or 'fp16'")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ConversionError(f"block_size must be a positive int, got {block_size!r}")


def to_fp16(graph: FerryGraph) -> tuple[FerryGraph, list[str]]:
    """Store float32 tensors as float16; the engine casts them back to float32 at load.

    Tensors with values beyond float16's range stay float32 (their names are returned).
    """
    tensors = dict(graph.tensors)
    casts = dict(graph.load_casts)
    kept = []
    for name, array in sorted(graph.tensors.items()):
        if array.dtype != np.float32 or array.size == 0:
            continue
        finite = array[np.isfinite(array)]
        if finite.size and float(np.abs(finite).max()) > FP16_MAX:
            kept.append(name)
            continue
        tensors[name] = array.astype(np.float16)
        casts[name] = "float32"
    return FerryGraph(**{**graph.__dict__, "tensors": tensors, "load_casts": casts}), kept
