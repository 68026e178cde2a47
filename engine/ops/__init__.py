"""Operator kernels, one module per family; importing this package fills the registry."""

from engine.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    conv,
    conv_transpose,
    dynamic_quantize,
    elementwise,
    fused,
    geglu,
    gemm,
    group_norm,
    normalization,
    pool,
    qdq_conv,
    qdq_matmul,
    quantized,
    raster,
    reduce,
    resize,
    shape,
    softmax,
    trilu,
)
from engine.ops.registry import CHECKS, LEGACY, PREPARES, REGISTRY, SELECTORS, kernel_for, kernel_name


def supported_operators() -> list[str]:
    """Names of the ONNX operators (default domain) the engine can run, sorted."""
    return sorted(REGISTRY)


__all__ = [
    "CHECKS",
    "LEGACY",
    "PREPARES",
    "REGISTRY",
    "SELECTORS",
    "kernel_for",
    "kernel_name",
    "supported_operators",
]
