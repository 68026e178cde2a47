"""Keeping a spinning helper thread off the CPU its caller runs on (Linux; elsewhere a no-op).

Linux wakes a sleeping thread on its waker's CPU when it judges that cache-friendly (wake
affine).  The team's worker (engine/team.py), woken at a run's start, then spins on the caller's
own CPU, halving the caller's time until the load balancer moves one of them, which can take
milliseconds: on a 2-vCPU Xeon, MobileNetV2's 2-thread runs after 50 ms idle took 12-13.5 ms,
slower than one thread (12.2), and 9.5 with the worker kept on the other CPU.  ``KeepApart``
restricts the helper to the allowed CPUs but the caller's, re-set only when the caller has
moved (one ``sched_getcpu`` call a run, a syscall when it changes).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable


@functools.cache
def _sched_getcpu() -> Callable[[], int] | None:
    """libc's sched_getcpu from the process's own symbols (``dlopen(NULL)``: no library search,
    which would spawn ldconfig), or None where there is none (not glibc / not Linux)."""
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError, TypeError):
        return None
    function.restype, function.argtypes = ctypes.c_int, []
    return function


def current_cpu() -> int | None:
    """The CPU the calling thread runs on now, or None where that cannot be asked."""
    getcpu = _sched_getcpu()
    if getcpu is None:
        return None
    cpu = getcpu()
    return cpu if cpu >= 0 else None


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask; empty where unknown)."""
    getter = getattr(os, "sched_getaffinity", None)
    return frozenset(getter(0)) if getter is not None else frozenset()


class KeepApart:
    """Keeps one thread (by native id) off its caller's CPU; owned by the team, one per worker."""

    def __init__(self, thread_id: int | None, allowed: frozenset[int]) -> None:
        self.thread_id = thread_id
        self.allowed = allowed
        self.excluded: int | None = None  # the caller CPU the thread was last kept off

    def away_from(self, cpu: int | None) -> bool:
        """Restrict the thread to the allowed CPUs but ``cpu`` (the caller's now); whether its
        affinity now excludes ``cpu``.  Nothing to do with fewer than two allowed CPUs, or where
        the thread's affinity cannot be set (then the scheduler places it, as before)."""
        if cpu is None or self.thread_id is None or cpu not in self.allowed or len(self.allowed) < 2:
            return False
        if cpu == self.excluded:
            return True
        try:
            os.sched_setaffinity(self.thread_id, self.allowed - {cpu})
        except (OSError, AttributeError):
            return False
        self.excluded = cpu
        return True
