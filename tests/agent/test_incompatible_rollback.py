"""A real agent process with a stream pipeline keeps its recent real events, and a new version
whose model fails on them is rolled back with the reason ``incompatible``, naming why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.stream.recent import load, ring_path
from converter import convert
from deploy.package import SignedClaims, generate_keypair, sign_package
from engine.format import read_package
from tests.agent.double import ORGANISATION_ID, AgentProcess, GatewayDouble, read_state, serve, wait_for
from tests.agent.stream.specs import spec
from tests.model_packages import write_package

pytestmark = pytest.mark.slow

KEYS = generate_keypair()


def _tabular(d: Path, name: str, pipeline: dict, *, features: int, declared: list, counter: int) -> Path:
    """A signed package: a features -> 2 scores model, its manifest input declared as given."""
    rng = np.random.default_rng(counter)
    w, b = rng.standard_normal((features, 2)).astype(np.float32), np.zeros(2, np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["features", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["scores"]),
        ],
        "tabular",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), d / f"{name}.u")
    package = read_package(d / f"{name}.u")
    write_package(
        d / f"{name}.unsigned",
        graph={k: v for k, v in package.graph.items() if k != "tensors"},
        tensors={k: np.array(v) for k, v in package.tensors.items()},
        inputs=[{**i, "shape": declared} for i in package.manifest["inputs"]],
        outputs=package.manifest["outputs"],
        metadata={**package.manifest["metadata"], "pipeline": pipeline},
    )
    sign_package(
        d / f"{name}.unsigned",
        d / f"{name}.ferry",
        KEYS.private_key,
        SignedClaims(organisation=ORGANISATION_ID),
    )
    return d / f"{name}.ferry"


def test_a_model_that_fails_on_recent_real_events_is_rolled_back_as_incompatible(tmp_path: Path):
    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps({"ts": i, "user": "m1", "kind": "low" if i % 2 == 0 else "high", "v": i}) + "\n"
            for i in range(40)
        )
    )
    pipeline = spec(
        source={"type": "file", "path": str(events), "from_start": True},
        windows=[{"name": "w", "type": "tumbling", "size": 10, "field": "v", "aggregates": ["mean"]}],
        triggers=[{"name": "spike", "field": "kind", "sequence": ["low", "high"]}],
        features={"input": "features", "values": ["w.mean", "event.v"]},
        batch={"size": 4, "max_wait_ms": 20},
        sinks=[{"type": "telemetry"}],
    )
    v1 = _tabular(tmp_path, "v1", pipeline, features=2, declared=["N", 2], counter=10)
    # its signature promises any feature count, and its own self-test sample fits it: only the
    # device's real events show that it wants 3 features where the pipeline assembles 2
    v2 = _tabular(tmp_path, "v2", pipeline, features=3, declared=["N", "F"], counter=20)

    double = GatewayDouble(KEYS)
    server, port = serve(double)
    state_dir = tmp_path / "state"
    agent = AgentProcess(state_dir, port)
    try:
        double.publish(v1, "v1")
        wait_for(lambda: read_state(state_dir)["running"] == "v1", 60, "v1 running", agent)
        wait_for(lambda: len(load(ring_path(state_dir))) == 40, 30, "the recent events saved", agent)

        double.publish(v2, "v2")
        refusal = wait_for(
            lambda: next((a for a in double.activations() if a["version_id"] == "v2" and not a["ok"]), None),
            60,
            "the rollback of v2 in telemetry",
            agent,
        )
        assert refusal["reason"].startswith("incompatible: the model fails on")
        assert "40 recent real event(s)" in refusal["reason"] and refusal["rolled_back_to"] == "v1"
        wait_for(
            lambda: (
                read_state(state_dir)["current"] == "v1" and read_state(state_dir)["update"] != "switching"
            ),
            30,
            "v1 current again",
            agent,
        )
        assert read_state(state_dir)["running"] == "v1"
    finally:
        agent.stop()
        server.stop(grace=None)
