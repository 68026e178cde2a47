"""The agent's one backoff: the delays stay within their bounds, and a stop ends a wait at once."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.retry import Backoff

seconds = st.floats(min_value=0.001, max_value=3600, allow_nan=False)


@st.composite
def backoffs(draw: st.DrawFn) -> Backoff:
    first = draw(seconds)
    cap = draw(st.floats(min_value=first, max_value=86_400))
    low = draw(st.floats(min_value=0.0, max_value=1.5))
    high = draw(st.floats(min_value=low, max_value=2.0))
    return Backoff(
        first=first,
        cap=cap,
        factor=draw(st.floats(min_value=1.0, max_value=10.0)),
        jitter=(low, high),
        rng=random.Random(draw(st.integers(0, 2**32))),
    )


@given(backoffs(), st.integers(min_value=1, max_value=200))
def test_each_delay_is_the_capped_exponential_times_the_jitter(backoff: Backoff, failures: int) -> None:
    low, high = backoff.jitter
    base = backoff.first
    for n in range(1, failures + 1):
        delay = backoff.failed()
        assert backoff.failures == n
        assert backoff.current == pytest.approx(base)
        assert low * base * (1 - 1e-9) <= delay <= high * base * (1 + 1e-9)
        assert delay <= high * backoff.cap * (1 + 1e-9)
        base = min(backoff.cap, base * backoff.factor)


@given(backoffs(), st.integers(min_value=1, max_value=50))
def test_the_un_jittered_delays_grow_to_the_cap_and_reset_starts_over(
    backoff: Backoff, failures: int
) -> None:
    bases = []
    for _ in range(failures):
        backoff.failed()
        bases.append(backoff.current)
    assert bases == sorted(bases) and bases[0] == backoff.first and max(bases) <= backoff.cap
    backoff.reset()
    assert backoff.failures == 0 and backoff.current == backoff.first
    backoff.failed()
    assert backoff.current == backoff.first


def test_many_failures_stay_at_the_cap_without_overflow() -> None:
    backoff = Backoff(first=1.0, cap=60.0, factor=10.0, jitter=(1.0, 1.0))
    delays = [backoff.failed() for _ in range(5000)]
    assert delays[:3] == [1.0, 10.0, 60.0] and set(delays[2:]) == {60.0}


@pytest.mark.parametrize(
    "first,cap,factor,jitter",
    [
        (0.0, 1.0, 2.0, (0.5, 1.0)),
        (2.0, 1.0, 2.0, (0.5, 1.0)),
        (1.0, 2.0, 0.5, (0.5, 1.0)),
        (1, 2, 2, (1, 0.5)),
    ],
)
def test_nonsense_settings_are_refused(first, cap, factor, jitter) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(first=first, cap=cap, factor=factor, jitter=jitter)


def test_a_stop_interrupts_an_hour_long_wait() -> None:
    """Only the stop event can end this wait: the thread would otherwise sleep for an hour."""
    backoff = Backoff(first=3600.0, cap=3600.0, jitter=(1.0, 1.0))
    stop, waiting = threading.Event(), threading.Event()
    outcome: list[bool] = []

    def retry_forever() -> None:
        while True:
            waiting.set()
            if backoff.wait_after_failure(stop):
                outcome.append(True)
                return

    thread = threading.Thread(target=retry_forever)
    thread.start()
    assert waiting.wait(10)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and outcome == [True] and backoff.failures == 1
