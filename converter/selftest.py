"""Self-test vectors: a fixed random input and the engine's output for it, stored in the package.

The device re-runs the input after installing and compares (engine Session.self_test), which
catches a corrupted install or an engine that computes differently there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import SelfTestError
from engine import EngineError, Session
from engine.ops.fastmath import fixed_forms

SEED = 20240601
ATOL, RTOL = 1e-4, 1e-3


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
    tensors = {f"selftest/input/{name}": array for name, array in feeds.items()}
    tensors.update({f"selftest/output/{name}": array for name, array in outputs.items()})
    meta = {
        "inputs": {name: f"selftest/input/{name}" for name in feeds},
        "outputs": {name: f"selftest/output/{name}" for name in outputs},
        "atol": ATOL,
        "rtol": RTOL,
    }
    return tensors, meta


def compare(got: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> tuple[float, float]:
    """Max abs error and cosine similarity over all outputs together (for the fp16 report)."""
    a = np.concatenate([got[k].astype(np.float64).reshape(-1) for k in sorted(reference)])
    b = np.concatenate([reference[k].astype(np.float64).reshape(-1) for k in sorted(reference)])
    max_abs = float(np.max(np.abs(a - b), initial=0.0))
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(a @ b / norms) if norms > 0 else float(np.array_equal(a, b))
    return max_abs, cosine
