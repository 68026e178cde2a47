"""A multi-thread session's planned runs go to its thread count or to one thread, whichever
its recent runs found faster (engine/plan_threads.py); the choice never changes results."""

from __future__ import annotations

import numpy as np

from engine import Session
from engine import plan_threads as pt
from engine.plan_threads import ThreadChoice
from tests.engine.helpers import run_reference, single_node_model, write_model_package


def _drive(choice: ThreadChoice, seconds: dict[int, float], runs: int) -> list[int]:
    """``runs`` planned runs, each taking ``seconds[threads]``; the counts picked, in order."""
    picked = []
    for _ in range(runs):
        threads = choice.pick()
        choice.record(threads, seconds[threads])
        picked.append(threads)
    return picked


def test_a_one_thread_session_has_nothing_to_choose():
    choice = ThreadChoice(1)
    assert _drive(choice, {1: 0.01}, 5) == [1] * 5


def test_both_counts_are_sampled_then_the_faster_runs():
    choice = ThreadChoice(2)
    picked = _drive(choice, {2: 0.050, 1: 0.020}, pt.FIRST_SAMPLES * 2 + 5)
    assert picked[: 2 * pt.FIRST_SAMPLES] == [2] * pt.FIRST_SAMPLES + [1] * pt.FIRST_SAMPLES
    assert picked[2 * pt.FIRST_SAMPLES :] == [1] * 5 and choice.best() == 1


def test_the_other_count_is_retried_ever_more_rarely_while_it_stays_slower():
    choice = ThreadChoice(4)
    picked = _drive(choice, {4: 0.050, 1: 0.020}, 2 * pt.FIRST_SAMPLES + 3 * pt.EXPLORE + 10)
    retries = [i for i, threads in enumerate(picked) if threads == 4 and i >= 2 * pt.FIRST_SAMPLES]
    gaps = np.diff(retries)
    assert len(retries) == 2 and gaps[0] == 2 * pt.EXPLORE, retries  # after EXPLORE, then 2x


def test_a_retry_that_finds_the_load_gone_switches_back():
    """Busy machine: one thread wins.  The load goes: the next re-try finds the session's own
    count faster and, once its recent median is, runs it again."""
    choice = ThreadChoice(2)
    _drive(choice, {2: 0.050, 1: 0.020}, 2 * pt.FIRST_SAMPLES + 2)
    assert choice.best() == 1
    picked = _drive(choice, {2: 0.005, 1: 0.020}, pt.WINDOW * pt.EXPLORE)
    assert choice.best() == 2
    assert picked[-pt.EXPLORE :].count(2) >= pt.EXPLORE - 1  # at most one re-try of 1 thread


def test_a_two_thread_session_gives_the_same_results_on_either_count(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    model, feeds = single_node_model("Conv", [x, w], {"pads": [1, 1, 1, 1]})
    session = Session(write_model_package(model, tmp_path / "m.ferry", feeds), threads=2)
    want = run_reference(model, feeds)[0]
    for _ in range(2 + 2 * pt.FIRST_SAMPLES + 2):  # record, plan, then the sampled runs
        got = next(iter(session.run(feeds).values()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (choice,) = session._thread_choices.values()  # one plan: one input shape
    assert all(len(choice.times[n]) >= pt.FIRST_SAMPLES for n in (2, 1))


def test_the_runs_on_one_thread_use_kernels_measured_on_one_thread(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    model, feeds = single_node_model("Conv", [x, w], {"pads": [1, 1, 1, 1]})
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path / "kernels"))
    session = Session(write_model_package(model, tmp_path / "m.ferry", feeds), threads=2)
    want = run_reference(model, feeds)[0]
    for _ in range(2 + 2 * pt.FIRST_SAMPLES):  # record, plan, then both counts sampled
        np.testing.assert_allclose(next(iter(session.run(feeds).values())), want, rtol=1e-4, atol=1e-4)
    (signature,) = session._thread_choices
    two, one = session._plans.get(signature), session._plans_one.get(signature)
    assert one is not None and one is not two and not session._records  # built, record dropped
    assert session._search.threads == 2 and session._part_search.threads == 1  # each its own search
    for name, value in one.constants.items():  # packed for the same kernel: the very same array
        if "@" in name and name in two.constants:
            assert value is two.constants[name]


def test_a_two_thread_sessions_planning_run_builds_its_one_thread_plan_too(tmp_path):
    """The planning run (a signature's second) pays for both plans, so no later run (one the
    thread choice sends to one thread) stalls on planning."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    model, feeds = single_node_model("Conv", [x, w], {"pads": [1, 1, 1, 1]})
    session = Session(write_model_package(model, tmp_path / "m.ferry", feeds), threads=2)
    session.run(feeds)
    assert not session._plans_one._plans  # the first run records only
    session.run(feeds)
    (signature,) = session._plans._plans
    assert session._plans_one.get(signature) is not None and not session._records
