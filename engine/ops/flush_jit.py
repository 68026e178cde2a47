"""Evicting an array from every level of the CPU's caches (x86's clflush), so the kernel search
can time a one-row product as a run finds its weights: in memory, not in the cache (numba).

A run of MobileNetV2 reads its classifier's 5 MB of weights from memory (0.27-0.34 ms, where
0.05-0.06 warm): its activations and other weights pass through the caches between two calls,
and the last-level cache is shared with the rest of the machine.  Timed warm, the two kernels
tied and the search picked either; cold, the GEMV kernel is 0.07 ms faster on one thread and
0.14 ms on two.  Elsewhere (no clflush) the node is timed warm, as before.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from engine import jit

AVAILABLE = platform.machine().lower() in ("x86_64", "amd64")
LINE = 64  # bytes of a cache line


@intrinsic
def _flush_line(typingctx, address):  # noqa: ANN001, ANN201, ARG001
    """clflush of the line holding ``address`` (an int64); nothing where there is none."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if AVAILABLE:
            byte_pointer = ir.IntType(8).as_pointer()
            function = builder.module.declare_intrinsic(
                "llvm.x86.sse2.clflush", fnty=ir.FunctionType(ir.VoidType(), [byte_pointer])
            )
            builder.call(function, [builder.inttoptr(args[0], byte_pointer)])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


@jit.njit([types.void(jit.array(types.uint8, 1, "C", readonly=True))])
def flush(data):  # noqa: ANN001, ANN202
    """Every cache line of ``data`` (an array's bytes) written back and evicted."""
    start = data.ctypes.data
    for offset in range(0, data.size, LINE):
        _flush_line(start + offset)
