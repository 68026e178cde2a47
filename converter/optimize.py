"""Graph optimization: the passes of converter/passes/, each FerryGraph -> FerryGraph, in order.

The passes, their order and why live in converter/passes/__init__.py, one module per pass;
the pass functions and PASSES are re-exported here for the code and tests that name them.
"""

from __future__ import annotations

from typing import Any

from converter import passes
from converter.lower import lower_data_movement
from converter.passes import PASSES, Pass
from converter.translate import FerryGraph

drop_pass_through = passes.drop_pass_through.run
fold_constants = passes.fold_constants.run
simplify_transposes = passes.simplify_transposes.run
simplify_reshapes = passes.simplify_reshapes.run
fuse_gelu = passes.fuse_gelu.run
fuse_layer_norm = passes.fuse_layer_norm.run
fuse_attention = passes.fuse_attention.run
fold_batch_norm = passes.fold_batch_norm.run
fuse_matmul_add = passes.fuse_matmul_add.run
fold_layer_norm_affine = passes.fold_layer_norm_affine.run
fuse_residual_add = passes.fuse_residual_add.run
fuse_activation = passes.fuse_activation.run
fold_attention_views = passes.fold_attention_views.run
fold_attention_scale = passes.fold_attention_scale.run
narrow_rows = passes.narrow_rows.run
drop_dead = passes.drop_dead.run

__all__ = [
    "PASSES",
    "Pass",
    "drop_dead",
    "drop_pass_through",
    "fold_attention_scale",
    "fold_attention_views",
    "fold_batch_norm",
    "fold_constants",
    "fold_layer_norm_affine",
    "fuse_activation",
    "fuse_attention",
    "fuse_gelu",
    "fuse_layer_norm",
    "fuse_matmul_add",
    "fuse_residual_add",
    "lower_data_movement",
    "narrow_rows",
    "optimize",
    "simplify_reshapes",
    "simplify_transposes",
]


def optimize(graph: FerryGraph) -> tuple[FerryGraph, list[dict[str, Any]]]:
    """Run every pass in order; return the graph and, per pass, the node count after it."""
    log = []
    for step in PASSES:
        graph = step(graph)
        log.append({"pass": step.__name__, "nodes": len(graph.nodes)})
    return graph, log
