"""Unsigned packages of a hand-built graph for the tests: the engine's model files (graph.json,
weights.bin) written into a package by the package library, as the converter does."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from deploy.package import write_package as write_files
from engine.format import model_files


def write_package(
    dst: str | os.PathLike[str],
    *,
    graph: dict[str, Any],
    tensors: dict[str, np.ndarray],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the package; returns its manifest."""
    files = model_files(graph=graph, tensors=tensors)
    return write_files(dst, files=files, inputs=inputs, outputs=outputs, metadata=metadata)
