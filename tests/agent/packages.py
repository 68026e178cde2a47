"""Real packages for agent tests, built by the real converter."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from converter import convert
from converter.samples import build_image_classifier
from deploy.package import write_package
from engine.format import model_files, read_package


def convert_classifier(path: Path, seed: int = 0, *, break_selftest: bool = False) -> Path:
    """An unsigned classifier package; with break_selftest its model no longer gives its
    recorded self-test output (so once signed it is valid but fails its health check)."""
    convert(build_image_classifier(seed=seed), path)
    if break_selftest:
        package = read_package(path)
        tensors = {k: np.array(v) for k, v in package.tensors.items()}
        for tensor in package.manifest["metadata"]["selftest"]["outputs"].values():
            tensors[tensor] = tensors[tensor] + 0.5
        graph = {k: v for k, v in package.graph.items() if k != "tensors"}
        write_package(
            path,
            files=model_files(graph=graph, tensors=tensors),
            inputs=package.manifest["inputs"],
            outputs=package.manifest["outputs"],
            metadata=package.manifest["metadata"],
        )
    return path
