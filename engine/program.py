"""The static half of planning: a package's graph checked and bound to kernels, with liveness.

Everything here depends only on the package, so it is done once at load: resolving each
node's kernel (collecting every unsupported op at once), checking the file's order is
topological, upcasting tensors stored at reduced precision, and working out after which
node each intermediate value is no longer needed so a run can drop it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import PackageError, UnsupportedOperatorError
from engine.ops import CHECKS, PREPARES, SELECTORS, kernel_for
from engine.ops.registry import Kernel, Selector

# Opset assumed when a graph does not say (the newest whose semantics the kernels follow).
DEFAULT_OPSET = 21


@dataclass
class Step:
    """One node bound to its kernel; ``release`` lists the values dead after it runs."""

    name: str
    op: str
    kernel: Kernel
    select: Selector | None
    attrs: dict[str, Any]
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    release: list[str] = field(default_factory=list)


@dataclass
class Program:
    steps: list[Step]
    constants: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]
    opset: int


def compile_program(graph: dict[str, Any], tensors: dict[str, np.ndarray], where: str) -> Program:
    """Bind a graph.json to kernels; raise UnsupportedOperatorError / PackageError if it cannot run.

    Besides nodes/inputs/outputs/tensors, graph.json may carry ``opset`` (default-domain
    version, for ops whose meaning changed) and ``load_casts`` ({tensor: dtype}: tensors
    stored narrower than they compute, e.g. fp16 weights of a float32 model).
    """
    nodes = graph.get("nodes")
    if not isinstance(nodes, list):
        raise PackageError(f"{where}: graph has no node list")
    opset = int(graph.get("opset", DEFAULT_OPSET))
    steps = _bind_kernels(nodes, opset, where)
    inputs, outputs = list(graph.get("inputs", [])), list(graph.get("outputs", []))
    used = {name for step in steps for name in step.inputs if name} | set(outputs)
    constants = _constants(tensors, graph.get("load_casts", {}), used)
    _check_order(steps, inputs, constants, outputs, where)
    _assign_releases(steps, set(outputs))
    return Program(steps=steps, constants=constants, inputs=inputs, outputs=outputs, opset=opset)


def _bind_kernels(nodes: list[dict[str, Any]], opset: int, where: str) -> list[Step]:
    steps, problems = [], []
    for index, node in enumerate(nodes):
        try:
            op, name = node["op"], node.get("name") or f"{node['op']}_{index}"
            inputs, outputs = list(node.get("inputs", [])), list(node.get("outputs", []))
        except (KeyError, TypeError) as exc:
            raise PackageError(f"{where}: node #{index} is malformed ({exc!r})") from exc
        kernel, attrs, reason = _resolve(op, dict(node.get("attrs") or {}), len(inputs), outputs, opset)
        if reason:
            problems.append(f"node {name!r}: {reason}")
            continue
        steps.append(Step(name, op, kernel, SELECTORS.get(op), attrs, inputs, outputs))
    if problems:
        raise UnsupportedOperatorError(
            f"{where}: {len(problems)} node(s) cannot run on this engine: " + "; ".join(problems)
        )
    return steps


def _resolve(
    op: str, attrs: dict[str, Any], n_inputs: int, outputs: list[str], opset: int
) -> tuple[Kernel | None, dict[str, Any], str | None]:
    """The node's kernel and prepared attrs, or the reason this engine cannot run it."""
    kernel = kernel_for(op, opset)
    if kernel is None:
        return None, attrs, f"operator {op} is not supported"
    if op in PREPARES:
        attrs = PREPARES[op](attrs, n_inputs, len(outputs))
    reason = CHECKS[op](attrs, n_inputs, len([o for o in outputs if o])) if op in CHECKS else None
    return kernel, attrs, reason


def unsupported_nodes(nodes: list[dict[str, Any]], opset: int = DEFAULT_OPSET) -> dict[str, str]:
    """Node name -> why this engine cannot run it; empty if it can run every node.

    The converter calls this so a model fails at conversion, not when a device loads it.
    """
    problems = {}
    for index, node in enumerate(nodes):
        name = node.get("name") or f"{node['op']}_{index}"
        outputs = list(node.get("outputs", []))
        _, _, reason = _resolve(
            node["op"], dict(node.get("attrs") or {}), len(node.get("inputs", [])), outputs, opset
        )
        if reason:
            problems[name] = reason
    return problems


def _constants(
    tensors: dict[str, np.ndarray], casts: dict[str, str], used: set[str]
) -> dict[str, np.ndarray]:
    """The tensors the graph reads, cast where the package stored them at lower precision."""
    out = {}
    for name in used & tensors.keys():
        array = tensors[name]
        out[name] = array.astype(np.dtype(casts[name])) if name in casts else array
    return out


def _check_order(
    steps: list[Step], inputs: list[str], constants: dict[str, np.ndarray], outputs: list[str], where: str
) -> None:
    defined = set(inputs) | set(constants)
    for step in steps:
        for name in step.inputs:
            if name and name not in defined:
                raise PackageError(
                    f"{where}: node {step.name!r} ({step.op}) reads {name!r}, which no graph input, "
                    "tensor or earlier node provides"
                )
        defined.update(o for o in step.outputs if o)
    missing = [name for name in outputs if name not in defined]
    if missing:
        raise PackageError(f"{where}: graph outputs {missing} are never produced")


def _assign_releases(steps: list[Step], keep: set[str]) -> None:
    """Each value is released right after its last reader (or its producer, if nobody reads it)."""
    last: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.outputs:
            if name:
                last[name] = index
        for name in step.inputs:
            if name:
                last[name] = index
    for name, index in last.items():
        if name not in keep:
            steps[index].release.append(name)
