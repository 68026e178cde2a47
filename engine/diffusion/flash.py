"""Where flash attention (attention_jit.py) may serve a FusedAttention node, decided without
numba: a Session whose attention nodes all fall outside it does not compile its kernels."""

from __future__ import annotations

from typing import Any

MIN_QUERIES = 256  # below this the BLAS kernels' whole-matrix passes are cheap enough
MAX_HEAD = 64  # wider heads: the BLAS products win


def shape_fits(q_shape: tuple[int, ...] | list[int] | None) -> bool:
    """Long enough (queries) and narrow enough (head) for flash attention."""
    return (
        q_shape is not None and len(q_shape) >= 2 and q_shape[-2] >= MIN_QUERIES and q_shape[-1] <= MAX_HEAD
    )


def may_serve(attrs: dict[str, Any]) -> bool:
    """False when the node's static query view (the converter's folded head split: its shape is
    fixed) rules flash attention out; True when only a run can tell."""
    views = attrs.get("views") or [None]
    if not views[0]:
        return True
    # a load's checked ViewLayout (engine.ops.fused.prepare_attention), or still its JSON
    shape = views[0]["shape"] if isinstance(views[0], dict) else views[0].shape
    return shape_fits(tuple(shape))
