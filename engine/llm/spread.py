"""A decode token on several threads (model.py's door to spread_jit's kernels, numba's or the
ahead-of-time extension's; numpy only, so an AOT process never imports numba).

How: ``token_open`` rounds the first input and opens the first GEMV; then ``token_work`` runs
on the caller and on the part pool's threads (``batch_split.share_out``), each call with the
GIL released.  Inside, the workers take each GEMV's vectors from shared counters and whichever
finishes a GEMV does the work before the next (spread_jit.py).  A worker that starts late finds
less to do, and one that never starts is not waited for: its item is run by the caller, which
then finds nothing left.  So the pool is woken once a token, as numba's was by the parallel
region this replaced (that region needed numba's pool free, and numba in the process).

The kernels read the weights through a table of addresses (``tables``) rather than typed lists:
an AOT extension cannot take numba's typed lists, and the table costs nothing to build.  The
arrays behind the addresses are the model's own (its memory-mapped weights and norms) and live
as long as the ``SpreadTables`` that lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import batch_split
from engine.llm.gemv import DOT_BLOCK8, DOT_SUB


@dataclass(frozen=True)
class SpreadTables:
    """What ``token_work`` reads that stays from token to token, made once per model."""

    matrices: np.ndarray  # int64 [GEMVs * 2, 2]: per GEMV its weights', then its scales' address, length
    logits: np.ndarray  # the LM head's output when it is the last GEMV (same kind), else empty
    like: np.ndarray  # an empty array of the scales' dtype: float32 (int8) or uint16 (int4's halves)
    floats: np.ndarray  # int64 [layers * 4, 2]: post norm, next norm, qkv bias, o bias
    scratch: tuple  # (xq, off, dx, block): the rounded input of the widest GEMV
    state: np.ndarray  # int64: per GEMV a claim and a done counter, then how many GEMVs are open
    arrays: tuple  # every array the tables point into, held alive here


def _rows(arrays: list[np.ndarray]) -> np.ndarray:
    """(address, length) of each C-contiguous array, read-only."""
    rows = np.array([(a.ctypes.data, a.size) for a in arrays], np.int64).reshape(-1, 2)
    rows.flags.writeable = False
    return rows


def tables(
    layers: list[tuple], floats: list[np.ndarray], widest: int, head: tuple | None = None
) -> SpreadTables:
    """The tables for layers as model.py's ``one_call`` holds them (each layer's four (weights,
    scales) of one kind on the dot layouts, then its block), ``floats`` as ``SpreadTables``
    orders them, scratch for inputs up to ``widest`` wide; ``head``: the LM head's (weights,
    scales, rows) when it is of the layers' kind, shared by the threads as the token's last GEMV
    (else model.py runs it after the token)."""
    matrices = [np.ascontiguousarray(layer[i]) for layer in layers for i in range(8)]
    logits = np.empty(0, np.float32)
    if head is not None:
        matrices += [np.ascontiguousarray(head[0]), np.ascontiguousarray(head[1])]
        logits = np.empty(head[2], np.float32)
    floats = [np.ascontiguousarray(f, np.float32) for f in floats]
    scales = matrices[1]
    block = DOT_BLOCK8 if scales.dtype == np.float32 else int(layers[0][8])
    scratch = (
        np.empty(widest, np.int8),
        np.empty(widest // DOT_SUB, np.int32),
        np.empty(widest // DOT_SUB, np.float32),
        block,
    )
    state = np.zeros(len(matrices) + 1, np.int64)  # 4 GEMVs a layer: 2 counters each, + 1
    like = np.empty(0, scales.dtype)
    like.flags.writeable = False
    return SpreadTables(_rows(matrices), logits, like, _rows(floats), scratch, state, (*matrices, *floats))


def run_token(kernels: Any, spread: SpreadTables, fixed: tuple, threads: int) -> None:
    """One token's layers (and the LM head, when in the tables) on up to ``threads`` threads.
    ``fixed``: eps, rope, cache, buffers (less ``logits``) as spread_jit's ``token_work`` takes
    them."""
    eps, rope, cache, buffers = fixed
    buffers = (*buffers, spread.logits)
    kernels.token_open(buffers[1], spread.scratch, spread.state)
    arguments = (
        spread.matrices,
        spread.like,
        spread.floats,
        eps,
        rope,
        cache,
        buffers,
        spread.scratch,
        spread.state,
    )
    batch_split.share_out(lambda _: kernels.token_work(*arguments), range(threads), threads)
