"""The optimization passes, one per module, each ``run(graph) -> graph``, and their order.

Every pass keeps the graph's inputs and outputs (names, meaning) exactly; tests run the
graph after each pass against onnxruntime on the original model.  Order matters only as
written in PASSES: folding first (it exposes constant weights), then pattern fusions (GELU,
LayerNorm, attention) before BatchNorm folding and bias/activation fusion (with a LayerNorm's
scale and bias folded into the MatMuls reading it, and a skip connection's Add into the Conv
before it), then static-shape data movement lowered to Raster nodes (converter/lower.py), the
head split and merge Rasters around attention folded into it as strided views (and its scale
into the q projection), rows nobody reads dropped from the last block of a classifier
(``narrow_rows``), and dead-node removal last.

A pass is named after what it does (verb_noun); its module's ``run`` is the pass function,
whose ``__name__`` the conversion report lists.
"""

from __future__ import annotations

from collections.abc import Callable

from converter.lower import lower_data_movement
from converter.passes import (
    drop_dead,
    drop_pass_through,
    fold_attention_scale,
    fold_attention_views,
    fold_batch_norm,
    fold_constants,
    fold_layer_norm_affine,
    fold_shape_values,
    fuse_activation,
    fuse_attention,
    fuse_geglu,
    fuse_gelu,
    fuse_group_norm,
    fuse_group_norm_silu,
    fuse_layer_norm,
    fuse_matmul_add,
    fuse_residual_add,
    merge_attention_scales,
    narrow_rows,
    simplify_reshapes,
    simplify_transposes,
)
from converter.translate import FerryGraph

Pass = Callable[[FerryGraph], FerryGraph]

PASSES: list[Pass] = [
    drop_pass_through.run,
    fold_constants.run,
    fold_shape_values.run,  # torch's shape arithmetic on dynamic graphs (attention's scale)
    simplify_transposes.run,
    simplify_reshapes.run,
    fuse_gelu.run,
    fuse_geglu.run,  # value * Gelu(gate) over a projection's halves: a UNet's feed-forward
    fuse_layer_norm.run,
    fuse_group_norm.run,
    fuse_group_norm_silu.run,  # GroupNorm + SiLU (Sigmoid, Mul): every UNet/VAE ResNet block
    merge_attention_scales.run,  # torch's q*s, kT*s -> one scale that fuse_attention matches
    fuse_attention.run,
    fold_batch_norm.run,
    fuse_matmul_add.run,
    fold_layer_norm_affine.run,
    fuse_residual_add.run,  # before fuse_activation: it takes the activation after the Add itself
    fuse_activation.run,
    lower_data_movement,
    fold_attention_views.run,
    drop_dead.run,  # the readers the two passes below look at must be live ones
    fold_attention_scale.run,
    narrow_rows.run,
    drop_dead.run,
]
