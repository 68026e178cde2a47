"""engine/cpu_affinity.py: a helper thread kept off its caller's CPU, re-set only when the caller
moves; and the team's worker kept off the CPU of the thread running a 2-thread plan (woken on
it by wake-affine scheduling, it had halved the caller's time).  Linux with 2+ CPUs only."""

from __future__ import annotations

import os
import threading

import pytest

from engine import cpu_affinity, jit

ALLOWED = cpu_affinity.allowed_cpus()
pytestmark = pytest.mark.skipif(
    len(ALLOWED) < 2 or cpu_affinity.current_cpu() is None, reason="needs Linux and two CPUs"
)


@pytest.fixture
def pinned_caller():
    """Pins this thread to one CPU at a time (``pin(cpu)``); its affinity is restored after."""
    before = os.sched_getaffinity(0)

    def pin(cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})

    yield pin
    os.sched_setaffinity(0, before)


@pytest.fixture
def helper():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join()


def test_a_helper_is_kept_off_the_callers_cpu_and_follows_it(helper, monkeypatch):
    first, second = sorted(ALLOWED)[:2]
    apart = cpu_affinity.KeepApart(helper.native_id, ALLOWED)
    assert apart.away_from(first)
    assert os.sched_getaffinity(helper.native_id) == ALLOWED - {first}
    calls = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda *args: calls.append(args))
    assert apart.away_from(first) and calls == []  # the caller did not move: no syscall
    monkeypatch.undo()
    assert apart.away_from(second)
    assert os.sched_getaffinity(helper.native_id) == ALLOWED - {second}


def test_nothing_is_done_where_it_cannot_be_or_need_not_be(helper):
    cpu = min(ALLOWED)
    assert not cpu_affinity.KeepApart(None, ALLOWED).away_from(cpu)
    assert not cpu_affinity.KeepApart(helper.native_id, frozenset({cpu})).away_from(cpu)
    assert not cpu_affinity.KeepApart(helper.native_id, ALLOWED).away_from(None)
    assert not cpu_affinity.KeepApart(helper.native_id, ALLOWED).away_from(max(ALLOWED) + 1)
    assert os.sched_getaffinity(helper.native_id) == ALLOWED  # left as it was


def test_the_teams_worker_runs_off_the_cpu_of_the_thread_running_the_plan(pinned_caller):
    if not jit.enabled():
        pytest.skip("no JIT tier (numba missing, or FERRY_JIT=0)")
    from engine import team

    worker = team.shared()._thread.native_id
    for cpu in sorted(ALLOWED)[:2]:
        pinned_caller(cpu)
        with team.shared().running() as running:
            assert running
            assert cpu_affinity.current_cpu() == cpu
            assert cpu not in os.sched_getaffinity(worker)
