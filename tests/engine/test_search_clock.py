"""The kernel search's clock: at one thread a candidate's CPU time, so time the scheduler gives
other processes (a busy device, a shared CI box) is not charged to whichever kernel was running."""

from __future__ import annotations

import time

import numpy as np

from engine import search
from engine.search import KernelSearch


def _off_cpu(seconds: float):
    """A 'kernel' that spends ``seconds`` off the CPU, as a preempted one does, and returns a result."""

    def kernel(args, attrs):  # noqa: ANN001, ANN202
        time.sleep(seconds)
        return [np.zeros(4, np.float32)]

    return kernel


def _on_cpu(seconds: float):
    """A 'kernel' that keeps the CPU busy for ``seconds``."""

    def kernel(args, attrs):  # noqa: ANN001, ANN202
        stop = time.thread_time() + seconds
        while time.thread_time() < stop:
            pass
        return [np.zeros(4, np.float32)]

    return kernel


def test_one_thread_times_cpu_and_more_threads_wall_time():
    waiting = _off_cpu(0.03)
    for threads, low, high in ((1, 0.0, 0.01), (2, 0.03, 1.0)):
        best = {waiting: float("inf")}
        search._time_rounds([(waiting, [])], {}, best, search.kernel_clock(threads))
        assert low <= best[waiting] < high, (threads, best[waiting])


def test_a_one_thread_search_charges_only_the_cpu_a_kernel_used(tmp_path, monkeypatch):
    """Off-CPU time (here a sleep, on a busy machine a preemption) does not count at one thread:
    the kernel that kept the CPU busy longer loses."""
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path))
    busy, preempted = _on_cpu(0.004), _off_cpu(0.02)
    chosen, note = KernelSearch("3" * 64, threads=1, use_jit=False)._fastest(
        [busy, preempted], {}, [], [(busy, []), (preempted, [])], set(), 0.0
    )
    assert chosen is preempted, note
    chosen, note = KernelSearch("4" * 64, threads=2, use_jit=False)._fastest(
        [busy, preempted], {}, [], [(busy, []), (preempted, [])], set(), 0.0
    )
    assert chosen is busy, note
