"""A model's declared inputs and outputs, and the check of a run's feeds against them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InputError, PackageError
from engine.plan import Signature


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: numpy dtype name, and dims as ints or symbolic names."""

    name: str
    dtype: str
    shape: list[int | str] | None


def check_feeds(inputs: list[TensorSpec], feeds: Mapping[str, np.ndarray]) -> Signature:
    """The feeds' shapes by input, in the model's input order; InputError lists every problem."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict of input name -> numpy array, got {type(feeds).__name__}")
    expected = [spec.name for spec in inputs]
    problems = [
        f"unknown input {name!r} (the model's inputs are {expected})"
        for name in feeds
        if name not in expected
    ]
    problems += [f"missing input {name!r}" for name in expected if name not in feeds]
    bindings: dict[str, tuple[int, str]] = {}
    for spec in inputs:
        if spec.name in feeds:
            problems += _check_one(spec, feeds[spec.name], bindings)
    if problems:
        raise InputError("; ".join(problems))
    return tuple((spec.name, tuple(np.shape(feeds[spec.name]))) for spec in inputs)


def read_specs(raw: Any, key: str, path: Path) -> list[TensorSpec]:
    """The manifest's inputs or outputs list, checked at load (an unknown dtype fails here)."""
    if not isinstance(raw, list):
        raise PackageError(f"{path}: manifest has no {key} list")
    specs = []
    for item in raw:
        np.dtype(item["dtype"])
        shape = item.get("shape")
        specs.append(TensorSpec(item["name"], item["dtype"], list(shape) if shape is not None else None))
    return specs


def _check_one(spec: TensorSpec, value: Any, bindings: dict[str, tuple[int, str]]) -> list[str]:
    """What is wrong with one feed (empty if nothing); symbolic dims must agree across inputs."""
    if not isinstance(value, np.ndarray | np.generic):
        return [f"input {spec.name!r} must be a numpy.ndarray, got {type(value).__name__}"]
    problems = []
    if value.dtype != np.dtype(spec.dtype):
        problems.append(f"input {spec.name!r} has dtype {value.dtype.name}, expected {spec.dtype}")
    if spec.shape is None:
        return problems
    if value.ndim != len(spec.shape):
        problems.append(
            f"input {spec.name!r} has shape {tuple(value.shape)} (rank {value.ndim}), "
            f"expected rank {len(spec.shape)}: {spec.shape}"
        )
        return problems
    for axis, (got, want) in enumerate(zip(value.shape, spec.shape, strict=True)):
        if isinstance(want, int) and got != want:
            problems.append(
                f"input {spec.name!r} has shape {tuple(value.shape)}, expected {spec.shape} "
                f"(dim {axis} must be {want})"
            )
        elif isinstance(want, str):
            seen = bindings.setdefault(want, (got, spec.name))
            if seen[0] != got:
                problems.append(
                    f"input {spec.name!r} dim {axis} ({want!r}) is {got}, but input {seen[1]!r} set {want!r} "
                    f"to {seen[0]}"
                )
    return problems
