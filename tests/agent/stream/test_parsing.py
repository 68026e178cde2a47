"""Parsing: malformed lines are counted, good ones kept."""

from __future__ import annotations

from agent.stream import Pipeline
from tests.agent.stream.specs import spec


def test_malformed_lines_are_counted_and_good_ones_kept():
    pipeline = Pipeline(spec(windows=[{"name": "w", "type": "tumbling", "size": 10, "field": "v"}]))
    lines = [
        '{"ts": 1, "user": "a", "v": 1}',
        "{broken",
        "[1, 2]",
        "",
        '{"ts": 2, "user": "a", "v": 3}',
        '{"v": 1}',
    ]
    pipeline.run(lines)
    assert pipeline.stats.malformed == 3  # broken JSON, not an object, no timestamp
    assert pipeline.by_name["w"].current("a") == {"count": 2, "sum": 4.0, "mean": 2.0, "min": 1.0, "max": 3.0}
