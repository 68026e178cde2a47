"""A packaged pipeline run by the agent's inference loop, and its health check."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.agent.stream.specs import spec


def _tabular_package(tmp_path: Path, pipeline: dict) -> Path:
    """A small converted model (8 features -> 2 scores) whose manifest carries a pipeline."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from converter import convert
    from engine.format import read_package
    from tests.model_packages import write_package

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((2, 2)).astype(np.float32), np.zeros(2, np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["features", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["scores"]),
        ],
        "tabular",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    convert(model, tmp_path / "u.ferry")
    package = read_package(tmp_path / "u.ferry")
    directory = tmp_path / "v1"
    directory.mkdir()
    write_package(
        directory / "p.ferry",
        graph={k: v for k, v in package.graph.items() if k != "tensors"},
        tensors={k: np.array(v) for k, v in package.tensors.items()},
        inputs=package.manifest["inputs"],
        outputs=package.manifest["outputs"],
        metadata={**package.manifest["metadata"], "pipeline": pipeline},
    )
    import tarfile

    with tarfile.open(directory / "p.ferry") as tar:
        tar.extractall(directory, filter="data")
    return directory


def test_the_agent_runs_a_packaged_pipeline_on_a_tailed_file(tmp_path: Path):
    from agent.inference import InferenceLoop
    from agent.install import health_check

    events, results = tmp_path / "events.jsonl", tmp_path / "results.jsonl"
    events.write_text("")
    pipeline = spec(
        source={"type": "file", "path": str(events), "from_start": True},
        windows=[{"name": "w", "type": "tumbling", "size": 10, "field": "v", "aggregates": ["mean"]}],
        triggers=[{"name": "spike", "field": "kind", "sequence": ["low", "high"]}],
        features={"input": "features", "values": ["w.mean", "event.v"]},
        batch={"size": 8, "max_wait_ms": 20},
        postprocess={"top_k": 1, "labels": ["normal", "anomaly"]},
        sinks=[{"type": "file", "path": str(results)}, {"type": "telemetry"}],
    )
    directory = _tabular_package(tmp_path, pipeline)
    health_check(directory)  # a valid pipeline passes the health check
    emitted: list[tuple] = []
    loop = InferenceLoop(emit=lambda kind, payload, version: emitted.append((kind, payload, version)))
    loop.start()
    loop.load(directory, "v1")
    try:
        with open(events, "a") as f:
            for i in range(20):
                f.write(
                    json.dumps({"ts": i, "user": "m1", "kind": "low" if i % 2 == 0 else "high", "v": i})
                    + "\n"
                )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            not results.exists() or len(results.read_text().splitlines()) < 10
        ):
            time.sleep(0.05)
    finally:
        loop.stop()
    written = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(written) == 10 and {r["trigger"] for r in written} == {"spike"}
    assert written[0]["top"][0]["label"] in ("normal", "anomaly")
    assert [e[0] for e in emitted] == ["event"] * 10 and emitted[0][2] == "v1"
    version, figures = loop.take_figures()
    assert version == "v1" and figures["inferences"] == 10 and sum(figures["top1_histogram"].values()) == 10


def test_a_package_with_an_invalid_pipeline_fails_its_health_check(tmp_path: Path):
    from agent.errors import ActivationError
    from agent.install import health_check

    directory = _tabular_package(tmp_path, spec(source={"type": "shell", "command": "rm -rf /"}))
    with pytest.raises(ActivationError, match="pipeline is invalid.*source"):
        health_check(directory)
