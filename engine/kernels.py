"""The kernel layer: for each operator, every correct kernel this process can run, numpy first.

numpy providers live beside their ops (``conv.conv_candidates``: im2col, direct GEMMs, Winograd,
depthwise; ``fused.attention_candidates``; ``streamed.candidates``: one-row products); JIT
providers live in the modules of ``engine.jit`` (each beside its numpy twin, e.g.
``engine/ops/conv/depthwise_jit.py``) and are consulted only when numba is installed and
enabled.  The kernel search (engine/search.py) measures what this returns; without numba the
same calls return numpy kernels only.

The first candidate is always the one the engine would run unsearched (the selector's pick, or
``default``: the kernel the first run used), and JIT candidates are offered only where that
default is the op's current kernel (a legacy opset meaning, e.g. Softmax before 13, has none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine import jit
from engine.ops import conv, streamed
from engine.ops.registry import REGISTRY, Kernel

Shapes = Sequence[tuple[int, ...] | None]
Provider = Callable[[dict[str, Any], Shapes], list[Kernel]]


def _fused_conv(attrs: dict[str, Any], shapes: Shapes) -> list[Kernel]:
    """The converter's FusedConv (Conv + activation): the Conv candidates, activation after."""
    from engine.ops import fused  # noqa: PLC0415 - the converter's module; optional here

    return [fused.with_activation(inner) for inner in conv.conv_candidates(attrs, shapes)]


def _attention(attrs: dict[str, Any], shapes: Shapes) -> list[Kernel]:
    """FusedAttention: all heads in batched matmuls, or one head at a time (which wins depends
    on the head count and sizes, and on the BLAS: measured, batched usually)."""
    from engine.ops import fused  # noqa: PLC0415 - the converter's module, as above

    return fused.attention_candidates(attrs, shapes)


def _llm_gemv(op: str) -> Provider:
    """The LLM runtime's decode GEMVs over int8/int4 weights (engine/llm/gemv.py's layouts)."""

    def provider(attrs: dict[str, Any], shapes: Shapes) -> list[Kernel]:
        from engine.llm.gemv import NUMPY_GEMV  # noqa: PLC0415 - only LLM sessions need it

        return [NUMPY_GEMV[op]]

    return provider


# Ops with several numpy kernels; their first candidate is the selector's pick.
NUMPY: dict[str, Provider] = {
    # a decode step's one-row products: BLAS's gemv, or W streamed row by row
    "MatMul": streamed.candidates("MatMul"),
    "FusedMatMul": streamed.candidates("FusedMatMul"),
    "Conv": conv.conv_candidates,
    "FusedConv": _fused_conv,
    "FusedAttention": _attention,
    "LlmGemvInt4": _llm_gemv("LlmGemvInt4"),
    "LlmGemvInt8": _llm_gemv("LlmGemvInt8"),
    "LlmDecodeAttention": _llm_gemv("LlmDecodeAttention"),
}


def ops(use_jit: bool = True) -> frozenset[str]:
    """The ops that may have more than one candidate kernel (worth measuring); JIT ones only
    when ``use_jit`` and numba is there."""
    found = set(NUMPY)
    for module in jit.loaded() if use_jit else []:
        found.update(module.CANDIDATES)
    return frozenset(found)


def candidates(
    op: str, attrs: dict[str, Any], shapes: Shapes, default: Kernel | None = None, use_jit: bool = True
) -> list[Kernel]:
    """Every kernel that can run this node, the unsearched one first, then JIT ones (if any and
    ``use_jit``)."""
    if op in NUMPY:
        found = NUMPY[op](attrs, shapes)
    elif default is not None:
        found = [default]
    else:
        found = [REGISTRY[op]] if op in REGISTRY else []
    if not use_jit or not found or (op not in NUMPY and found[0] is not REGISTRY.get(op)):
        return found
    return found + jit_candidates(op, attrs, shapes)


def jit_candidates(op: str, attrs: dict[str, Any], shapes: Shapes) -> list[Kernel]:
    """The JIT kernels for this node (none without numba)."""
    found: list[Kernel] = []
    for module in jit.loaded():
        provider = module.CANDIDATES.get(op)
        if provider is not None:
            found += provider(attrs, shapes)
    if op == "FusedConv":
        from engine.ops import fused  # noqa: PLC0415 - as above

        found += [fused.with_activation(inner) for inner in jit_candidates("Conv", attrs, shapes)]
    return found


def tier(kernel: Kernel) -> str:
    """``"jit"`` for a JIT kernel, else ``"numpy"`` (profiles and the benchmark print it)."""
    return "jit" if getattr(kernel, "jit", False) else "numpy"
