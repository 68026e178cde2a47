"""Tumbling and sliding windows (with CSV parsing and a filter in front)."""

from __future__ import annotations

from agent.stream import Pipeline
from tests.agent.stream.specs import spec


def test_csv_filters_and_tumbling_and_sliding_windows():
    pipeline = Pipeline(
        spec(
            parse={"format": "csv", "fields": ["ts", "user", "kind", "v"]},
            filters=[{"field": "kind", "op": "ne", "value": "noise"}],
            windows=[
                {"name": "t", "type": "tumbling", "size": 10, "field": "v"},
                {"name": "s", "type": "sliding", "size": 30, "slide": 10, "field": "v"},
            ],
        )
    )
    rows = [(ts, "a", "x", ts) for ts in range(0, 45)] + [(5, "b", "x", 100), (6, "b", "noise", 1)]
    pipeline.run([",".join(str(c) for c in row) for row in rows])
    assert pipeline.stats.filtered_out == 1
    t, s = pipeline.by_name["t"].current("a"), pipeline.by_name["s"].current("a")
    assert (t["count"], t["min"], t["max"]) == (10, 30.0, 39.0)  # the last closed window: [30, 40)
    assert (s["count"], s["min"], s["max"]) == (30, 10.0, 39.0)  # panes [10,20) [20,30) [30,40)
    assert pipeline.by_name["t"].current("b") == {
        "count": 1,
        "sum": 100.0,
        "mean": 100.0,
        "min": 100.0,
        "max": 100.0,
    }
