"""Planning: a 1x1 expansion and the 3x3 depthwise conv that alone reads it become one band step.

Where the search chose the JIT GEMM for the expansion (conv_1x1_gemm) and the register-tiled
depthwise kernel (conv_depthwise_jit_vec) for the conv after it, and the wide tensor between
them would not stay in a core's L2 (``MIN_WIDE_BYTES``), the pair runs as
engine/ops/conv/expand_depthwise_jit.py's band kernel, which never writes that tensor out (the
bands' reason and figures are in its note).  A rule, not a search candidate: the search times
one node's kernels with their inputs in cache, where the band kernel has nothing to gain, and
it cannot weigh a kernel that replaces two planned steps.  Same results bit for bit.

Not in plans that share their convs with the team (2 threads, team.py): the band kernel runs
on one thread, and the two kernels it replaces are shared.  ``FERRY_EXPAND_FUSION=0`` keeps the
pairs apart (benchmarks, A/B runs).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

import numpy as np

from engine import jit
from engine.ops.registry import kernel_name

NOTE = "fused 1x1 expansion and depthwise 3x3: run in bands kept in L2"
# the JIT GEMM's 1x1 kernels, 32- or 16-wide: the band kernel packs the weights 32-wide anyway
EXPANSIONS = frozenset(
    {"conv.conv_1x1_gemm", "conv.fused_conv_1x1_gemm", "conv.conv_1x1_gemm8", "conv.fused_conv_1x1_gemm8"}
)
DEPTHWISE = frozenset({"conv.conv_depthwise_jit_vec", "conv.fused_conv_depthwise_jit_vec"})
MODULE = "engine.ops.conv.expand_depthwise_jit"


def enabled() -> bool:
    return os.environ.get("FERRY_EXPAND_FUSION", "1") != "0"


def fuse_expand(
    steps: list, record: Any, keep: set[str], packed: dict[str, np.ndarray], with_team: bool
) -> list:
    """The planned steps with each fusable expansion/depthwise pair replaced by one step named
    after the depthwise conv (its outputs, its place in the order); the expansion's weights,
    packed for the band kernel, are added to ``packed`` (the plan's constants)."""
    if with_team or not enabled() or not any(kernel_name(s.kernel) in DEPTHWISE for s in steps):
        return steps
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step.inputs:
            if name:
                readers.setdefault(name, []).append(index)
    drop: set[int] = set()
    for index, expand in enumerate(steps):
        if kernel_name(expand.kernel) not in EXPANSIONS or len(expand.inputs) > 3 or not _clips(expand):
            continue
        wide = expand.outputs[0]
        found = readers.get(wide, [])
        if len(found) != 1 or wide in keep or not _wide_enough(record.info.get(wide)):
            continue
        weights = expand.inputs[1].split("@")[0]  # the filter the search's choice packed
        if weights not in record.static or record.static[weights].ndim != 4:
            continue
        depthwise = steps[found[0]]
        if (
            kernel_name(depthwise.kernel) not in DEPTHWISE
            or len(depthwise.inputs) > 3
            or not _clips(depthwise)
        ):
            continue
        if depthwise.inputs[0] != wide:
            continue
        module = jit.module(MODULE)
        name = f"{weights}@{kernel_name(module.expand_depthwise)}"
        packed.setdefault(name, module.pack_expansion(record.static[weights]))
        bias_e = expand.inputs[2] if len(expand.inputs) > 2 else ""
        bias_d = depthwise.inputs[2] if len(depthwise.inputs) > 2 else ""
        steps[found[0]] = replace(
            depthwise,
            op="ExpandDepthwise",
            kernel=module.expand_depthwise,
            attrs={"expand": expand.attrs, "depthwise": depthwise.attrs},
            inputs=[expand.inputs[0], name, bias_e, depthwise.inputs[1], bias_d],
            note=NOTE,
        )
        drop.add(index)
    return [s for i, s in enumerate(steps) if i not in drop]


def _clips(step: Any) -> bool:
    """No activation, or one the kernels apply in their last pass (a Relu or Clip)."""
    return step.attrs.get("activation") in (None, "Relu", "Clip")


def _wide_enough(value: Any) -> bool:
    if value is None or value.dtype.itemsize != 4:
        return False
    return math.prod(value.shape) * 4 >= jit.module(MODULE).MIN_WIDE_BYTES
