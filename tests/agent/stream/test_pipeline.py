"""The pipeline: features from triggers, batched inference, post-processing, live sources' idle ticks."""

from __future__ import annotations

import json

from agent.stream import Pipeline, postprocess
from tests.agent.stream.specs import spec


def test_triggers_assemble_features_and_inference_is_batched():
    calls: list[int] = []
    results: list[dict] = []

    def infer(rows: list[list[float]]):
        calls.append(len(rows))
        return [[1.0 - row[0] / 10, row[0] / 10] for row in rows]

    pipeline = Pipeline(
        spec(
            windows=[{"name": "w", "type": "tumbling", "size": 100, "field": "v", "aggregates": ["count"]}],
            triggers=[{"name": "buy", "field": "kind", "sequence": ["buy"]}],
            features={"input": "x", "values": ["w.count", "event.v"]},
            batch={"size": 4, "max_wait_ms": 10_000},
            postprocess={"threshold": 0.5, "top_k": 1, "labels": ["low", "high"]},
        ),
        infer=infer,
        sinks=[results.append],
    )
    lines = [json.dumps({"ts": i, "user": "a", "kind": "buy", "v": i}) for i in range(10)]
    pipeline.run(lines, chunk=3)
    assert calls == [4, 4, 2]  # batches of four, the rest on the final flush
    assert pipeline.stats.inferences == 10 and len(results) == 10
    assert results[7]["top"][0]["label"] == "high" and results[7]["alert"] is True
    assert results[1]["top"][0]["label"] == "low" and results[1]["key"] == "a"


def test_postprocess_top_k_and_labels():
    out = postprocess([0.1, 0.7, 0.2], {"top_k": 2, "labels": ["cat", "dog"], "threshold": 0.8})
    assert [t["label"] for t in out["top"]] == ["dog", "2"] and out["alert"] is False


def test_failed_inference_is_counted_and_the_stream_goes_on():
    def broken(rows):
        raise RuntimeError("model exploded")

    pipeline = Pipeline(
        spec(
            triggers=[{"name": "t", "field": "kind", "sequence": ["x"]}],
            features={"input": "x", "values": ["event.v"]},
            batch={"size": 2},
        ),
        infer=broken,
    )
    pipeline.run([json.dumps({"ts": i, "user": "a", "kind": "x", "v": 1}) for i in range(5)])
    assert pipeline.stats.inference_errors == 5 and pipeline.stats.triggers == 5


def test_a_live_source_processes_partial_chunks_and_stale_batches():
    results: list[dict] = []
    pipeline = Pipeline(
        spec(
            triggers=[{"name": "t", "field": "kind", "sequence": ["x"]}],
            features={"input": "x", "values": ["event.v"]},
            batch={"size": 100, "max_wait_ms": 0},
        ),
        infer=lambda rows: [[1.0] for _ in rows],
        sinks=[results.append],
    )
    seen_while_idle: list[int] = []

    def live():
        yield json.dumps({"ts": 1, "user": "a", "kind": "x", "v": 1}) + "\n"
        yield ""  # the source has nothing new
        seen_while_idle.append(len(results))
        yield ""

    pipeline.run(live(), chunk=1000)
    assert seen_while_idle == [1]  # not held back until 1000 lines or 100 rows arrive
