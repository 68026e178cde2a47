"""Reading a package's self-test vectors (metadata "selftest"), for Session.self_test and the
agent's health check.

A vector is stored as is, except where the converter stored a large one compactly (to keep
self-test vectors from growing a quantized package past its size budget: a GPT step's KV-cache
inputs and outputs were 6.3 MB of a 42 MB int8 package):

- ``input_codes`` {input: {"scale", "shape"}}: the float input is stored as signed 4-bit codes,
  two per byte (engine.ops.quantized's packing), and is ``codes * scale`` in the input's dtype
  (the converter picked values on that grid, so this is exact);
- ``output_strides`` {output: stride}: only every ``stride``-th element of the flattened output
  is stored, and only those are compared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.quantized import unpack4


def feeds(
    spec: dict[str, Any], tensors: dict[str, np.ndarray], dtypes: dict[str, str]
) -> dict[str, np.ndarray]:
    """The self-test inputs as the model takes them (``dtypes``: input name -> dtype name)."""
    codes = spec.get("input_codes") or {}
    found = {}
    for name, tensor in spec["inputs"].items():
        stored = np.array(tensors[tensor])
        if name in codes:
            dtype = np.dtype(dtypes[name])
            values = unpack4(stored, [int(d) for d in codes[name]["shape"]], signed=True)
            stored = values.astype(dtype) * dtype.type(codes[name]["scale"])
        found[name] = stored
    return found


def observed(spec: dict[str, Any], name: str, value: np.ndarray) -> np.ndarray:
    """The part of output ``name`` the self-test stored: all of it, or a strided sample."""
    stride = (spec.get("output_strides") or {}).get(name)
    return value if not stride else np.ascontiguousarray(value.reshape(-1)[:: int(stride)])
