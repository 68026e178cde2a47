"""Reusable work buffers for kernels: the part of an arena that pays off most in numpy.

A fresh multi-megabyte temporary costs page faults on first touch (measured: allocating
and filling a 4.9 MB array took longer than the nine multiply-adds of the depthwise conv
it served).  Kernels take their internal temporaries (im2col columns, Winograd tiles,
depthwise phases and accumulators) from here instead: one buffer per purpose and thread,
grown to the largest size asked for and reused by every later call.  Contents are
undefined on return, and a scratch buffer must never escape the kernel (outputs are
always fresh arrays: they live on in the run's values and may be handed to the caller).
"""

from __future__ import annotations

import math
import threading

import numpy as np

_local = threading.local()  # per thread: two Sessions may run on two threads at once


def scratch(purpose: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A C-contiguous work array of ``shape`` and ``dtype`` with undefined contents."""
    dtype = np.dtype(dtype)
    need = math.prod(shape) * dtype.itemsize
    buffers: dict[str, np.ndarray] | None = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    buffer = buffers.get(purpose)
    if buffer is None or buffer.nbytes < need:
        buffer = buffers[purpose] = np.empty(max(need, 64), dtype=np.uint8)
    return np.ndarray(shape, dtype, buffer)  # half the cost of buffer[:need].view().reshape()


def zeroed(purpose: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    array = scratch(purpose, shape, dtype)
    array.fill(0)
    return array


def release() -> None:
    """Drop this thread's buffers (their memory goes back to the allocator)."""
    _local.buffers = {}
