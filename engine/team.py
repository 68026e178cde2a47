"""The spinning worker of a 2-thread planned run (engine/ops/team_jit.py's kernels).

A ``Team`` owns one daemon thread, which lives in ``team_jit.serve`` (GIL released) from its
start to the process's exit.  ``Team.running()`` wakes it for the length of one planned run: it
spins, taking a share of each job the run publishes (a GEMM, a depthwise conv, a softmax, a GELU),
until the run ends; then it sleeps on a futex until the next run opens.  The wake (30-75 us on
the 2-core hosts) is paid once a run, and no run waits for it: the caller claims work too, so a
worker that wakes late joins late.  Each run keeps the worker off the caller's CPU
(``engine.cpu_affinity``): woken on it, it halved the caller's time.

While the team runs, JIT kernels that would start numba's pool (``jit.run``) run serially, and
OpenBLAS is held at one thread by the session: their sleeping threads and this spinning one
would contend for the second core (a team GEMM measured 1.3-2x the serial speed alone, slower
than serial with numba's pool threads about).

One team per process (``shared()``), used by one run at a time: a second session's run at the
same moment runs its kernels as it did before (numba's pool).  A forked child starts without
the thread and makes its own on first use.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
from collections.abc import Container, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine import cpu_affinity, jit

MODULE = "engine.ops.team_jit"
# the jobs a team shares: gemm8_jit's GEMM (6 x 16 tiles, AVX2), gemm_jit's (6 x 32, AVX-512),
# attention_jit's row softmax, depthwise_vec_jit's 3x3 depthwise conv, rows_jit's exact GELU,
# direct_jit's implicit-GEMM conv (a CNN's stem), gemv_jit's dot products (its classifier) and
# Winograd's input and output tile transforms (winograd_tiles_jit, by rows of tiles)
GEMM8, GEMM32, SOFTMAX, DEPTHWISE, GELU, DIRECT, GEMV, WINO_IN, WINO_OUT = range(9)
# multiply-adds from which a kernel shares its work with a spinning worker: ~10 us of work,
# against a few us to open the job and meet the worker at its end
MIN_MACS = 1 << 18
# elements from which a row job (a softmax, a GELU) is shared: ~10-25 us of work
MIN_ROW_ELEMENTS = 1 << 14
# ... and with numba's pool (~20 us on one core): its launch costs 5-10 us idle, and on a loaded
# 2-core host far more (MobileNetV2's 7x7 layers took twice their one-thread time on two)
POOL_MIN_MACS = 2_000_000
CONVS, PRODUCTS = ("Conv", "FusedConv"), ("MatMul", "FusedMatMul")
ITEM_BITS = 20  # a job's items are counted in 20 bits of team_jit's claim word
MAX_ITEMS = 1 << ITEM_BITS
MIN_SHARED = 4  # shared products (``shares``) that make a run the team's (``wanted``)
MIN_ROWS = 48  # a product's rows from which its GEMM is shared (fewer: a decode step's GEMVs)
# the JIT modules whose kernels share convs' and products' GEMMs with the team
CONV_KERNELS, PRODUCT_KERNELS = "engine.ops.conv.gemm8_jit", "engine.ops.matmul_jit"


class Team:
    """One spinning worker thread and the state it shares with the caller."""

    def __init__(self) -> None:
        kernels = jit.module(MODULE)
        self._kernels = kernels
        self._state = np.zeros(kernels.STATE_SLOTS, np.int64)
        self._table = np.zeros((kernels.TABLE_ROWS, 2), np.int64)
        self._floats = np.zeros(2, np.float32)
        self._busy = threading.Lock()
        # each kind's job kernel, and the arguments it takes before the job's own
        self._jobs: dict[int, tuple[Any, tuple[int, ...]]] = {
            GEMM8: (kernels.gemm_shared, (GEMM8,)),
            GEMM32: (kernels.gemm_shared, (GEMM32,)),
            SOFTMAX: (kernels.softmax_shared, ()),
            DEPTHWISE: (kernels.depthwise_shared, ()),
            GELU: (kernels.gelu_shared, ()),
            DIRECT: (kernels.direct_shared, ()),
            GEMV: (kernels.gemv_shared, ()),
            WINO_IN: (kernels.wino_in_shared, ()),
            WINO_OUT: (kernels.wino_out_shared, ()),
        }
        arrays = (self._state, self._table, self._floats)
        self._thread = threading.Thread(target=kernels.serve, args=arrays, name="ferry-team", daemon=True)
        self._thread.start()
        # the worker kept off the caller's CPU at each run (engine.cpu_affinity: wake-affine
        # scheduling put it on the caller's CPU after an idle spell)
        self._apart = cpu_affinity.KeepApart(self._thread.native_id, cpu_affinity.allowed_cpus())

    def close(self) -> None:
        """Stop the worker (at exit: it must not be running compiled code while the interpreter
        tears down)."""
        self._kernels.signal(self._state, self._kernels.STOP, 1)
        self._thread.join(timeout=5)

    @contextmanager
    def running(self) -> Iterator[bool]:
        """The worker spins for the block's length; yields False (and spins nothing) when another
        run holds the team."""
        if not self._busy.acquire(blocking=False):
            yield False
            return
        try:
            self._apart.away_from(cpu_affinity.current_cpu())
            self._kernels.signal(self._state, self._kernels.RUN, 1)
            _local.team = self
            try:
                yield True
            finally:
                _local.team = None
                self._kernels.signal(self._state, self._kernels.RUN, 0)
        finally:
            self._busy.release()

    def share(self, kind: int, *args: Any) -> None:
        """The work items of a job of ``kind`` (its kernel's arguments, first item 0) shared
        with the worker."""
        kernel, lead = self._jobs[kind]
        kernel(self._state, self._table, self._floats, *lead, *args)


_local = threading.local()
_team: Team | None = None
_team_lock = threading.Lock()


def shared() -> Team:
    """The process's team, made (and its kernels compiled or loaded) on first use."""
    global _team
    with _team_lock:
        if _team is None:
            _team = Team()
            atexit.register(_team.close)
        return _team


def run(kind: int, serial: Any, parallel: Any, *args: Any, shared: bool = True) -> None:
    """A job's work items (``serial``'s arguments) on several threads: shared with the team's
    worker during a team run, else on numba's pool (``jit.run``); on this thread alone when not
    ``shared`` (the caller's ``worth_sharing`` said no)."""
    if not shared:
        serial(*args)
        return
    running = active()
    if running is not None and args[-1] < MAX_ITEMS:
        running.share(kind, *args)
    else:  # (under the team numba's pool is closed: serial)
        jit.run(serial, parallel, *args)


def worth_sharing(macs: int) -> bool:
    """Whether a product of ``macs`` multiply-adds goes to several threads: from MIN_MACS with
    the team's worker, which is spinning already, from POOL_MIN_MACS on numba's pool."""
    if jit.threads() < 2:
        return False
    return macs >= (MIN_MACS if active() is not None else POOL_MIN_MACS)


def active() -> Team | None:
    """The team running on this thread's current run, if any."""
    return getattr(_local, "team", None)


def wanted(threads: int, steps: Iterable[Any], record: Any) -> bool:
    """Whether a run on ``threads`` of ``steps``, as their first run recorded them (a
    planner.Record, or None), goes to the team: one with MIN_SHARED or more products the team
    shares (``shares``).  The rest of a run's BLAS work runs on one thread under the team, so a
    decode step (GEMVs only) keeps OpenBLAS's threads: its 2-thread runs took 1.1x longer with
    the team."""
    if record is None or threads < 2 or not jit.enabled():
        return False
    return sum(1 for step in steps if shares(step, record.info, record.static)) >= MIN_SHARED


def shares(step: Any, info: Mapping[str, Any], fixed: Container[str]) -> bool:
    """Whether ``step``'s product is a GEMM the team shares, its JIT kernels loaded: a conv's, or
    a matrix product by fixed 2-D weights over MIN_ROWS rows or more (matmul_jit's: BERT's
    2-thread runs took 0.7-0.8x their time on OpenBLAS's two threads, ViT-Tiny's 0.9-0.95x).
    ``info``: the values' recorded shapes (``.shape``); ``fixed``: the values known for the plan."""
    if step.op in CONVS:
        return CONV_KERNELS in sys.modules
    if step.op not in PRODUCTS or len(step.inputs) < 2 or step.inputs[1] not in fixed:
        return False
    a, w = info.get(step.inputs[0]), info.get(step.inputs[1])
    if a is None or w is None or PRODUCT_KERNELS not in sys.modules:
        return False
    return len(a.shape) >= 2 and len(w.shape) == 2 and math.prod(a.shape[:-1]) >= MIN_ROWS


def possible(threads: int, steps: Iterable[Any]) -> bool:
    """Whether any run of ``steps`` on ``threads`` could go to the team (``wanted``), before
    shapes are known, with the JIT modules loaded so far: a session then loads the team's
    kernels with its own (not where it loads no JIT kernels at all: a decode step's numpy-only
    session stays without numba's ~120 MB)."""
    if threads < 2 or not jit.enabled():
        return False
    return any(step.op in CONVS and CONV_KERNELS in sys.modules for step in steps) or any(
        step.op in PRODUCTS and PRODUCT_KERNELS in sys.modules for step in steps
    )


def prepare() -> None:
    """The team's kernels compiled, or loaded from the disk cache, without starting its thread."""
    jit.module(MODULE)


@contextmanager
def session_run(enabled: bool, threads: int) -> Iterator[int]:
    """A run on ``threads`` (or its planning: the kernel search measures what the runs will do)
    with the team, when ``enabled``: its worker spinning and numba's pool closed (parallel JIT
    kernels run serially, the team's GEMMs shared).  Yields the BLAS thread count for the run:
    one with the team (OpenBLAS's workers spin and yield for ~0.1 s after each call, sharing
    the second core with this worker: it then joined 1 in 10 of MobileNetV2's GEMMs), else
    ``threads``.  Without ``enabled``, or while another run holds the team, as before."""
    if not enabled or threads < 2:
        yield threads
        return
    with shared().running() as running:
        if not running:
            yield threads
            return
        with jit.pool_closed():
            yield 1


def _forget_in_child() -> None:
    global _team, _team_lock
    _team, _team_lock = None, threading.Lock()  # the thread did not survive the fork


os.register_at_fork(after_in_child=_forget_in_child)
