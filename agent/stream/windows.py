"""Per-key tumbling and sliding windows by event time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Window:
    """Per-key tumbling window (or the panes of a sliding one), by event time.

    The hot path only moves a closed window's raw state aside; aggregates are computed when a
    feature asks for them (far less often than events arrive).
    """

    name: str
    size: float
    field: str
    aggregates: tuple[str, ...]
    slide: float | None = None  # sliding: panes of this length, the last size/slide of them count
    open: dict[Any, list] = field(default_factory=dict)  # key -> [start, count, sum, min, max]
    closed: dict[Any, Any] = field(default_factory=dict)  # key -> last closed state (tumbling) or panes

    def __post_init__(self) -> None:
        self.pane = self.slide or self.size
        self.panes_kept = int(self.size // self.pane)

    def add(self, key: Any, ts: float, value: float) -> None:
        start = ts - ts % self.pane
        state = self.open.get(key)
        if state is None or state[0] != start:
            if state is not None:
                if self.slide is None:
                    self.closed[key] = state
                else:
                    panes = self.closed.get(key)
                    if panes is None:
                        panes = self.closed[key] = deque(maxlen=self.panes_kept)
                    panes.append(state)
            self.open[key] = [start, 1, value, value, value]
            return
        state[1] += 1
        state[2] += value
        if value < state[3]:
            state[3] = value
        elif value > state[4]:
            state[4] = value

    def current(self, key: Any) -> dict[str, float]:
        """The latest closed window's aggregates (the open one's so far when none closed yet)."""
        closed = self.closed.get(key)
        if closed is None:
            state = self.open.get(key)
            return (
                _aggregate(state[1], state[2], state[3], state[4]) if state else _aggregate(0, 0.0, 0.0, 0.0)
            )
        if self.slide is None:
            return _aggregate(closed[1], closed[2], closed[3], closed[4])
        cutoff = closed[-1][0] + self.pane - self.size
        live = [p for p in closed if p[0] >= cutoff]
        return _aggregate(
            sum(p[1] for p in live), sum(p[2] for p in live), min(p[3] for p in live), max(p[4] for p in live)
        )


def _aggregate(count: int, total: float, low: float, high: float) -> dict[str, float]:
    return {"count": count, "sum": total, "mean": total / count if count else 0.0, "min": low, "max": high}
