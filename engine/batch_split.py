"""Data-parallel runs: a multi-thread session runs a batch of n as k parts of n/k, one part
per thread, each part's kernels serial (BLAS and JIT capped at one thread).

Why: BLAS (OpenBLAS's pthreads) and numba's pool split every call statically, one share per
thread, and wait at the end for the slowest.  On a busy machine a parked pool thread costs a
time slice at each of a UNet step's hundreds of parallel calls: batch 2 (guidance), 32x32
latents, 2 threads beside ~10 busy processes on 2 cores took 2984 ms a step against 544 ms on
one thread (onnxruntime, whose caller takes over a parked worker's share: 997 and 390 ms).  A
part is a whole planned run, hundreds of milliseconds with no barrier inside, so a thread the
scheduler parks for a slice costs that slice once; and a part no worker has started when the
caller is done with its own is run by the caller (``run_parts``), so a run never waits for a
thread that has not begun.  As for a whole run (``engine.plan_threads``), the session times its
split runs against the parts run one after another on the caller and runs the faster.  The
first run of the signature (the reference below) runs whole, on one thread.

Splitting is only right for a graph whose outputs for one batch item depend on that item's
inputs alone (a classifier, an encoder, a UNet: not one that mixes the batch, or bakes its
size into a Reshape).  The session checks it on the first run's feeds: the parts' joined
outputs must match the whole batch's (``agree``) before any split run is returned.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

Feeds = dict[str, np.ndarray]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def part_count(specs: Sequence[Any], feeds: Mapping[str, np.ndarray], threads: int) -> int:
    """How many parts a run of ``feeds`` splits into on ``threads`` threads: the largest
    k <= threads dividing the batch, or 0 when it does not split (one thread; an input
    without a leading dim, or whose leading dim is fixed in the model, or differs from the
    others')."""
    if threads < 2 or not specs:
        return 0
    batches = set()
    for spec in specs:
        value = feeds[spec.name]
        if value.ndim == 0 or (spec.shape and isinstance(spec.shape[0], int)):
            return 0
        batches.add(value.shape[0])
    if len(batches) != 1:
        return 0
    (batch,) = batches
    return next((k for k in range(min(threads, batch), 1, -1) if batch % k == 0), 0)


def split(feeds: Mapping[str, np.ndarray], parts: int) -> list[Feeds]:
    """``feeds`` cut into ``parts`` equal batches (views: axis 0 of a C-order array)."""
    size = next(iter(feeds.values())).shape[0] // parts
    return [{name: value[i * size : (i + 1) * size] for name, value in feeds.items()} for i in range(parts)]


def join(results: Sequence[Mapping[str, np.ndarray]]) -> Feeds:
    """The parts' outputs as one batch again."""
    return {name: np.concatenate([r[name] for r in results]) for name in results[0]}


def agree(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> bool:
    """Whether the split run's outputs are the whole batch's (as the kernel search compares
    candidates: parts may run other kernels, so rounding differs)."""
    for name, expected in want.items():
        value = got.get(name)
        if value is None or value.shape != expected.shape or value.dtype != expected.dtype:
            return False
        if expected.dtype.kind not in "fc":
            if not np.array_equal(value, expected):
                return False
            continue
        scale = max(1.0, float(np.max(np.abs(expected), initial=0)))
        if not np.allclose(value, expected, rtol=1e-3, atol=1e-4 * scale, equal_nan=True):
            return False
    return True


def run_parts(run: Callable[[Feeds], Feeds], parts: Sequence[Feeds]) -> list[Feeds]:
    """``run`` on every part: the caller takes part 0, pool threads the others, and the caller
    also takes any part no pool thread has started by the time it is free."""
    todo = deque(range(1, len(parts)))
    results: list[Feeds | None] = [None] * len(parts)

    def take() -> None:
        while True:
            try:
                index = todo.popleft()  # atomic: each part is taken once
            except IndexError:
                return
            results[index] = run(parts[index])

    futures: list[Future[None]] = [_workers().submit(take) for _ in range(len(parts) - 1)]
    results[0] = run(parts[0])
    take()
    for future in futures:
        if not future.cancel():  # one still queued (the pool busy with another session's) has nothing left
            future.result()  # a part's failure is the run's
    return [r for r in results if r is not None]


def share_out(run: Callable[[Any], object], items: Sequence[Any], threads: int) -> None:
    """``run(item)`` for every item on up to ``threads`` threads, as ``run_parts``: the caller
    and pool threads take items in turn, so a parked pool thread holds up one item at most
    (a kernel's row chunks; the kernel runs serial code on each)."""
    todo = deque(items)

    def take() -> None:
        while True:
            try:
                item = todo.popleft()  # atomic: each item is taken once
            except IndexError:
                return
            run(item)

    futures = [_workers().submit(take) for _ in range(min(threads, len(items)) - 1)]
    take()
    for future in futures:
        if not future.cancel():
            future.result()  # an item's failure is the call's


def _workers() -> ThreadPoolExecutor:
    """One pool for the process (sessions take turns; an idle pool thread sleeps)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, (os.cpu_count() or 2) - 1), thread_name_prefix="ferry-part")
        return _pool
