"""How many threads a session's planned runs use: its ``threads``, or one where that is faster
on this machine now.

``Session(threads=n)`` caps the thread pools (BLAS, JIT) at n.  On an idle machine n threads
are faster; on a busy one (a device running other work beside the model, a shared box) they can
be far slower than one: every parallel region waits for its slowest thread, a pool thread the
scheduler has parked costs a time slice, and idle pool threads spin after a call and take the
CPU from the caller's next node.  MobileNetV2 at 2 threads beside ~8 busy processes on 2 cores:
425 ms a run, 53 ms on one thread (onnxruntime, whose caller takes over a parked worker's share:
45 ms).  So the session times its planned runs per thread count and runs the faster: the median
of the last WINDOW runs of each, both sampled first, then the other count re-tried now and then
(load changes): after EXPLORE runs, and twice as long after each re-try that changed nothing (up
to MAX_EXPLORE), since on a busy machine a re-try at 2 threads can cost ten runs' time.  A
1-thread session has nothing to choose.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 8  # recent planned runs per thread count whose median decides
FIRST_SAMPLES = 3  # runs of each count before choosing
EXPLORE = 16  # runs before the count not chosen is re-tried...
MAX_EXPLORE = 1024  # ...doubling after each re-try that did not change the choice, up to this


class ThreadChoice:
    """The thread count for each planned run of a session allowed ``threads``."""

    def __init__(self, threads: int) -> None:
        self.options = (threads, 1) if threads > 1 else (threads,)
        self.times: dict[int, deque[float]] = {option: deque(maxlen=WINDOW) for option in self.options}
        self._until_retry = EXPLORE
        self._interval = EXPLORE
        self._retrying: int | None = None  # the choice a re-try run is questioning

    def pick(self) -> int:
        """The count the next planned run should use."""
        if len(self.options) == 1:
            return self.options[0]
        for option in self.options:
            if len(self.times[option]) < FIRST_SAMPLES:
                return option
        best = self.best()
        self._until_retry -= 1
        if self._until_retry > 0:
            return best
        self._retrying = best
        return next(option for option in self.options if option != best)

    def best(self) -> int:
        """The count whose recent runs were faster (the session's own while unmeasured)."""
        measured = [option for option in self.options if self.times[option]]
        if not measured:
            return self.options[0]
        return min(measured, key=lambda option: statistics.median(self.times[option]))

    def record(self, threads: int, seconds: float) -> None:
        """A planned run with ``threads`` took ``seconds`` (wall time)."""
        if threads not in self.times:
            return
        if self._retrying is not None and seconds < statistics.median(self.times[self._retrying]):
            # faster than the choice now: its older runs date from another load, forget them
            self.times[threads].clear()
        self.times[threads].append(seconds)
        if self._retrying is not None:
            same = self.best() == self._retrying
            self._interval = min(2 * self._interval, MAX_EXPLORE) if same else EXPLORE
            self._until_retry, self._retrying = self._interval, None
