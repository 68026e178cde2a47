"""Which of the JIT tier's modules a model needs, read off its program before any run: numba
and its LLVM cost ~120 MB of peak RSS and ~0.5 s of load, so a Session brings them in only where
its model's nodes can use a JIT kernel that pays for that, and skips modules none can use."""

from __future__ import annotations

from engine import jit as jit_tier
from engine.diffusion import flash
from engine.program import Program, Step


def jit_ops(program: Program) -> set[str]:
    """The ops of this model that JIT kernels may serve (a Conv when grouped or wider than 1x1; a
    FusedMatMul only with a GELU).  GELU alone does not bring numba in: its JIT kernel measured
    within noise of numpy's GELU (ViT 197x768: 1.06 vs 0.75 ms, BERT 128x1536: 1.55 vs 1.60), and
    numba's LLVM costs ~120 MB of peak RSS and ~0.5 s of load; where numba is loaded anyway (a
    depthwise conv, an int8 matmul) the GELU kernels are measured too.  Attention's JIT softmax
    rides along the same way: loading numba for it alone put ViT-Tiny's peak RSS at 190 MB
    against onnxruntime's 92."""
    served = set().union(*jit_tier.MODULES.values())
    ops = {step.op for step in program.steps if step.op in served and may_serve(step)}
    return ops if ops - set(RIDER_OPS) or many_query_attention(program) else set()


# From this many queries (an attention's static view) a transformer's JIT kernels bring numba in
# themselves: its GEMM, GELU, LayerNorm and softmax took ViT-Tiny from 1.23x to 1.09x
# onnxruntime's time, BERT from 1.06x to 0.95x, for ~125 MB more peak RSS and ~0.5 s more load.
# A decode step (1 query, memory-bound GEMVs) gained nothing: numpy-only.
MANY_QUERIES = 16


def many_query_attention(program: Program) -> bool:
    for step in program.steps:
        query = (step.attrs.get("views") or [None])[0] if step.op == "FusedAttention" else None
        shape = getattr(query, "shape", None) or (query.get("shape") if isinstance(query, dict) else None)
        if shape and len(shape) >= 2 and int(shape[-2]) >= MANY_QUERIES:
            return True
    return False


def jit_unused(program: Program) -> set[str]:
    """JIT modules serving this model's ops that none of its nodes can use: flash attention where
    every attention node's static views are too short (ViT-Tiny's 197 queries, BERT's 128, a
    decode step's 1); its kernels were ~3 s of a first compile's CPU for nothing."""
    attention = [step for step in program.steps if step.op == "FusedAttention"]
    if attention and not any(flash.may_serve(step.attrs) for step in attention):
        return {"engine.diffusion.attention_jit"}
    return set()


# JIT kernels that never bring numba in on their own (see jit_ops)
RIDER_OPS = ("FusedMatMul", "MatMul", "Gelu", "FusedGeglu", "FusedAttention", "LayerNormalization", "MaxPool")


def may_serve(step: Step) -> bool:
    if step.op in ("Conv", "FusedConv"):
        # grouped (depthwise) convs, and ungrouped ones with a window: direct_jit's implicit GEMM
        # (ResNet18's 7x7 stem 1.36 ms against numpy's best 3.27, its 64-channel 3x3s 1.33 vs 1.65)
        window = step.attrs.get("kernel_shape") or ()
        return int(step.attrs.get("group", 1)) > 1 or any(int(k) > 1 for k in window)
    if step.op == "FusedMatMul":
        return step.attrs.get("activation") == "Gelu"
    return True
