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


@dataclass(frozen=True)
class Comparison:
    """Two series on one scale: the release's devices against the rest of the fleet."""

    name: str
    release: Series | None
    fleet: Series | None
    peak: float


def comparison(name: str, release: list[float | None], fleet: list[float | None]) -> Comparison | None:
    """Both series drawn against the higher of their peaks; None when neither has a value."""
    present = [v for v in (*release, *fleet) if v is not None]
    if not present:
        return None
    peak = max(present) or 1.0
    return Comparison(
        name=name,
        release=_scaled(name, release, peak),
        fleet=_scaled(name, fleet, peak),
        peak=peak,
    )


def _scaled(name: str, values: list[float | None], peak: float) -> Series | None:
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    if not present:
        return None
    step = WIDTH / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{HEIGHT - v / peak * (HEIGHT - 10):.1f}" for i, v in present)
    if len(present) == 1:  # one point draws nothing as a polyline: a short flat stroke instead
        x, y = points.split(",")
        points = f"{max(float(x) - 4, 0):.1f},{y} {min(float(x) + 4, WIDTH):.1f},{y}"
    return Series(name=name, points=points, latest=present[-1][1], peak=max(v for _, v in present))
