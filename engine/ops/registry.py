"""The operator registry: op name -> plain kernel function, plus the hooks a few ops need.

A kernel is ``fn(inputs, attrs) -> list[np.ndarray]``: ``inputs`` are the node's input
arrays in order (``None`` for an omitted optional input), ``attrs`` the node's attributes
as written by the converter (JSON values), and every attribute the kernel reads has the
ONNX spec's default.  Kernels never modify their inputs: those may be weights mapped
read-only from the package or arrays the caller still holds.

Three optional hooks sit next to the registry, keyed by the same op name:

- ``CHECKS[op](attrs, n_inputs, n_outputs)`` returns a reason the node cannot run (an
  attribute value or output this engine does not implement), or None.  Called at load so
  an unsupported feature fails there, not halfway through a run.
- ``SELECTORS[op](attrs, input_shapes)`` returns the kernel function best suited to those
  shapes (e.g. Conv: 1x1 matmul, depthwise, im2col).  Called once per input-shape
  signature by the planner; whatever it returns must still be correct for any shape.
- ``LEGACY[op] = (since, fn)``: before opset ``since`` the op meant something else that
  attributes alone cannot tell apart (Softmax before 13 flattened to 2-D), so ``fn``
  runs for older opsets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Kernel = Callable[[list[np.ndarray | None], dict[str, Any]], list[np.ndarray]]
Check = Callable[[dict[str, Any], int, int], str | None]
Selector = Callable[[dict[str, Any], Sequence[tuple[int, ...] | None]], Kernel]

REGISTRY: dict[str, Kernel] = {}
CHECKS: dict[str, Check] = {}
SELECTORS: dict[str, Selector] = {}
LEGACY: dict[str, tuple[int, Kernel]] = {}


def register(*ops: str) -> Callable[[Kernel], Kernel]:
    """Register the decorated kernel under each op name."""

    def decorate(fn: Kernel) -> Kernel:
        for op in ops:
            if op in REGISTRY:
                raise ValueError(f"operator {op} registered twice")
            REGISTRY[op] = fn
        return fn

    return decorate


def check(*ops: str) -> Callable[[Check], Check]:
    def decorate(fn: Check) -> Check:
        for op in ops:
            CHECKS[op] = fn
        return fn

    return decorate


def selector(*ops: str) -> Callable[[Selector], Selector]:
    def decorate(fn: Selector) -> Selector:
        for op in ops:
            SELECTORS[op] = fn
        return fn

    return decorate


def legacy(op: str, since: int) -> Callable[[Kernel], Kernel]:
    def decorate(fn: Kernel) -> Kernel:
        LEGACY[op] = (since, fn)
        return fn

    return decorate


def kernel_for(op: str, opset: int) -> Kernel | None:
    """The kernel implementing ``op`` as defined at ``opset``, or None if unsupported."""
    if op in LEGACY and opset < LEGACY[op][0]:
        return LEGACY[op][1]
    return REGISTRY.get(op)


def kernel_name(fn: Kernel) -> str:
    """A short stable name for profiles and the search's cache: ``<family>.<function>``, the
    family being the op module (``engine.ops.conv.winograd`` counts as ``conv``: a family
    split into files by algorithm keeps the names cached choices were saved under)."""
    module = getattr(fn, "__module__", "") or ""
    prefix = "engine.ops."
    family = (
        module[len(prefix) :].split(".", 1)[0] if module.startswith(prefix) else module.rsplit(".", 1)[-1]
    )
    return f"{family}.{getattr(fn, '__name__', type(fn).__name__)}"


Prepare = Callable[[dict[str, Any], int, int], dict[str, Any]]
PREPARES: dict[str, Prepare] = {}


def prepare(*ops: str) -> Callable[[Prepare], Prepare]:
    """Register a load-time rewrite of a node's attrs that needs its input/output counts
    (e.g. Split without sizes splits evenly into as many parts as it has outputs)."""

    def decorate(fn: Prepare) -> Prepare:
        for op in ops:
            PREPARES[op] = fn
        return fn

    return decorate
