"""The round trip of a cache line between this machine's first two CPUs: two threads, pinned one
to each, pass a counter back and forth through one int64 (numba, the GIL released).

Why: every 2-thread figure depends on it.  On the 2-vCPU cloud hosts the bench runs on it was
55-80 ns in some minutes and 330-360 ns in others (the host put the two vCPUs on neighbouring
cores, or on different chiplets), and a 2-thread MobileNetV2 run followed it: onnxruntime 4.2
against 6.6 ms, Ferry 5.3 against 7.1.  bench/engine.py prints it at each model's 2-thread
phase, so a reader can tell a slow phase from a slow runtime.

    .venv/bin/python bench/core_latency.py

Prints figures; it is not a test.  None (not measured) without numba or with one CPU.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script: the repository's engine, not bench/engine.py
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

TRIPS = 20_000


@functools.cache
def _kernels() -> tuple[Any, Any]:
    import numba  # noqa: PLC0415 - only where the JIT tier is installed

    from engine.ops.atomic_jit import atomic_load, atomic_store, pause, yield_core  # noqa: PLC0415

    @numba.njit(nogil=True)
    def wait_for(flag, value):  # noqa: ANN001, ANN202
        spins = 0
        while atomic_load(flag, 0) != value:
            pause()
            spins += 1
            if spins % 4096 == 0:  # on one CPU after all: let the other thread run
                yield_core()

    @numba.njit(nogil=True)
    def answer(flag, trips):  # noqa: ANN001, ANN202
        for i in range(trips):
            wait_for(flag, 2 * i + 1)
            atomic_store(flag, 0, 2 * i + 2)

    @numba.njit(nogil=True)
    def ask(flag, trips):  # noqa: ANN001, ANN202
        for i in range(trips):
            atomic_store(flag, 0, 2 * i + 1)
            wait_for(flag, 2 * i + 2)

    return answer, ask


def round_trip_ns(trips: int = TRIPS) -> float | None:
    """Nanoseconds for one round trip between CPUs 0 and 1 (median of three batches), or None
    where it cannot be measured (no numba, one CPU, affinity not settable)."""
    from engine import jit  # noqa: PLC0415

    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if not jit.enabled() or len(allowed) < 2:
        return None
    first, second = sorted(allowed)[:2]
    answer, ask = _kernels()
    times = []
    try:
        for _ in range(3):
            flag = np.zeros(16, np.int64)
            ask(flag, 0), answer(flag, 0)  # compiled before the clock starts

            def other(flag: np.ndarray = flag) -> None:
                os.sched_setaffinity(0, {second})  # this thread only (Linux: 0 is the caller)
                answer(flag, trips)

            os.sched_setaffinity(0, {first})
            thread = threading.Thread(target=other)
            thread.start()
            time.sleep(0.01)  # the other thread on its CPU before the first ask
            start = time.perf_counter()
            ask(flag, trips)
            times.append((time.perf_counter() - start) / trips * 1e9)
            thread.join()
    except OSError:
        return None
    finally:
        os.sched_setaffinity(0, allowed)
    return float(np.median(times))


if __name__ == "__main__":
    found = round_trip_ns()
    print("not measured (no JIT tier, or one CPU)" if found is None else f"CPU0 <-> CPU1: {found:.0f} ns")
