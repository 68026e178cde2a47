"""Self-test vectors: a fixed random input and the engine's output for it, stored in the package.

The device re-runs the input after installing and compares (engine Session.self_test), which
catches a corrupted install or an engine that computes differently there.

Large vectors are stored compactly (engine/selftest.py reads both forms), so that they do not
grow a quantized package past its size budget (a GPT step's KV-cache inputs and outputs were
6.3 MB, 15 % of its int8 package): a float input of more than COMPACT_BYTES gets values on a
1/4 grid within [-2, 1.75] (N(0, 1) samples rounded and clipped, ``on_grid``, before the run)
and is stored as signed 4-bit codes, two per byte, with that scale; an output of more than
MAX_OUTPUT_ELEMENTS is stored as a strided sample of about that many elements, whose stride
spans the whole output.  Small ones stay exactly as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import SelfTestError
from converter.quantize import pack4
from engine import EngineError, Session
from engine.ops.fastmath import fixed_forms

SEED = 20240601
ATOL, RTOL = 1e-4, 1e-3
COMPACT_BYTES = 64 * 1024  # a float input larger than this is stored as 4-bit codes
GRID = 4  # ...of values k / GRID, -8 <= k <= 7
MAX_OUTPUT_ELEMENTS = 16384  # an output larger than this is stored as a strided sample


def make_inputs(specs: list[dict[str, Any]], seed: int = SEED) -> dict[str, np.ndarray]:
    """One seeded random array per input; dynamic dims are 1.  Integer inputs get 0/1 (safe as indices)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = tuple(d if isinstance(d, int) else 1 for d in spec["shape"])
        dtype = np.dtype(spec["dtype"])
        if dtype.kind == "f":
            feeds[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec["name"]] = rng.random(shape) < 0.5
        else:
            feeds[spec["name"]] = rng.integers(0, 2, size=shape).astype(dtype)
    return feeds


def _compact(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" and value.nbytes > COMPACT_BYTES


def on_grid(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds with every large float input moved onto the int8 code grid (so the stored
    codes reproduce it exactly on the device); other inputs unchanged."""
    return {
        name: (np.clip(np.rint(value * GRID), -8, 7) / GRID).astype(value.dtype) if _compact(value) else value
        for name, value in feeds.items()
    }


def run(package: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a written package single-threaded and with the engine's fixed math forms, so the
    stored outputs (and so the package's bytes) depend neither on the core count nor on which
    form this process measured fastest (engine.ops.fastmath)."""
    try:
        with fixed_forms():
            return Session(package, threads=1).run(feeds)
    except EngineError as exc:
        raise SelfTestError(f"the engine cannot run the converted model: {exc}") from exc


def vectors(
    feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors to add to the package and the manifest metadata that points at them."""
    tensors: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"inputs": {}, "outputs": {}, "atol": ATOL, "rtol": RTOL}
    codes, strides = {}, {}
    for name, array in feeds.items():
        key = meta["inputs"][name] = f"selftest/input/{name}"
        if _compact(array):
            values = np.rint(array.astype(np.float64) * GRID)
            if not (values.min(initial=0) >= -8 and values.max(initial=0) <= 7) or not np.array_equal(
                values / GRID, array
            ):
                raise SelfTestError(f"self-test input {name!r} is not on the 4-bit grid (use on_grid)")
            codes[name] = {"scale": 1 / GRID, "shape": list(array.shape)}
            array = pack4(values.astype(np.int8))
        tensors[key] = array
    for name, array in outputs.items():
        key = meta["outputs"][name] = f"selftest/output/{name}"
        if array.size > MAX_OUTPUT_ELEMENTS:
            strides[name] = -(-array.size // MAX_OUTPUT_ELEMENTS) | 1  # odd: no lock-step with even dims
            array = np.ascontiguousarray(array.reshape(-1)[:: strides[name]])
        tensors[key] = array
    if codes:
        meta["input_codes"] = codes
    if strides:
        meta["output_strides"] = strides
    return tensors, meta


def compare(got: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> tuple[float, float]:
    """Max abs error and cosine similarity over all outputs together (for the fp16 report)."""
    a = np.concatenate([got[k].astype(np.float64).reshape(-1) for k in sorted(reference)])
    b = np.concatenate([reference[k].astype(np.float64).reshape(-1) for k in sorted(reference)])
    max_abs = float(np.max(np.abs(a - b), initial=0.0))
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(a @ b / norms) if norms > 0 else float(np.array_equal(a, b))
    return max_abs, cosine
