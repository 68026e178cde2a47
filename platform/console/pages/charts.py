"""Small line charts drawn on the server as SVG: no script, no library, nothing to load."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH, HEIGHT = 600, 120


@dataclass(frozen=True)
class Series:
    name: str
    points: str  # the polyline's "x,y x,y ..." in the chart's viewBox
    latest: float | None
    peak: float


def line(name: str, values: list[float | None]) -> Series | None:
    """``values`` oldest first, drawn to fill the chart (absent values skipped); None if empty."""
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    if not present:
        return None
    peak = max(v for _, v in present) or 1.0
    step = WIDTH / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{HEIGHT - v / peak * (HEIGHT - 10):.1f}" for i, v in present)
    return Series(name=name, points=points, latest=present[-1][1], peak=peak)
