"""Retrying a link to the gateway: exponential backoff with jitter and a cap, and a prompt stop.

Each consecutive failure waits longer (``first``, ``first * factor``, ... up to ``cap``) so a
gateway that is down is not hammered; each wait is scaled by a random factor from ``jitter``
so a fleet that lost the gateway together does not come back in lockstep; and every wait is
on the agent's stop event, so a shutdown never sits out a minute-long backoff.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """The delays between attempts of one kind (check-ins, the hints stream, ...)."""

    first: float = 1.0  # the wait after the first failure, before jitter
    cap: float = 60.0  # no wait is longer than cap (times the jitter's high end)
    factor: float = 2.0
    jitter: tuple[float, float] = (0.5, 1.0)  # each wait is multiplied by uniform(low, high)
    rng: random.Random = field(default_factory=random.Random, repr=False)
    failures: int = field(default=0, init=False)
    _base: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        low, high = self.jitter
        if not (0 < self.first <= self.cap and self.factor >= 1 and 0 <= low <= high):
            raise ValueError(f"backoff needs 0 < first <= cap, factor >= 1, 0 <= jitter low <= high: {self}")

    @property
    def current(self) -> float:
        """The un-jittered wait after the latest failure (``first`` when none has failed yet)."""
        return self._base or self.first

    def failed(self) -> float:
        """Count one more consecutive failure; return how long to wait before the next attempt."""
        self.failures += 1
        # multiplied step by step rather than first * factor ** n: no overflow after many failures
        self._base = self.first if self.failures == 1 else min(self.cap, self._base * self.factor)
        return self.jittered(self._base)

    def reset(self) -> None:
        """The link works again: the next failure starts from ``first``."""
        self.failures, self._base = 0, 0.0

    def jittered(self, seconds: float) -> float:
        """``seconds`` scaled by the jitter (also for regular intervals: no fleet in lockstep)."""
        return seconds * self.rng.uniform(*self.jitter)

    def wait_after_failure(self, stop: threading.Event) -> bool:
        """Count a failure and wait its delay, or less if ``stop`` is set: True means stop."""
        return stop.wait(self.failed())
