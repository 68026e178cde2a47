"""The durable ring of recent events, and the health check that replays them through a new
version's pipeline so a model that does not take what the pipeline feeds is refused."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.stream import EventRing, Pipeline
from agent.stream.recent import MAX_LINE_BYTES, load, ring_path, state_dir_of
from tests.agent.stream.specs import spec


def test_the_ring_keeps_the_newest_events_bounded_and_survives_a_restart(tmp_path: Path):
    path = ring_path(tmp_path)
    ring = EventRing(path, max_events=5, max_bytes=1000, save_every=0)
    ring.extend([f'{{"i": {i}}}\n' for i in range(12)])
    assert ring.lines() == [f'{{"i": {i}}}' for i in range(7, 12)]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # written by rename
    again = EventRing(path, max_events=5, max_bytes=1000)
    assert again.lines() == ring.lines()
    # a line too long to be worth keeping is skipped, not allowed to push out the others
    again.extend(["x" * (MAX_LINE_BYTES + 1)])
    assert again.lines() == ring.lines()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=300).filter(lambda s: "\n" not in s), max_size=60), st.integers(1, 20))
def test_the_ring_never_holds_more_than_its_bounds(tmp_path_factory, lines, max_events):
    path = tmp_path_factory.mktemp("ring") / "r.json"
    ring = EventRing(path, max_events=max_events, max_bytes=2000, save_every=0)
    ring.extend(lines)
    kept = ring.lines()
    assert len(kept) <= max_events and sum(len(line.encode()) for line in kept) <= 2000
    assert kept == [line for line in lines if line][-len(kept) :] if kept else True
    assert load(path) == kept  # what is saved is exactly what is held


def test_a_damaged_ring_is_ignored_not_fatal(tmp_path: Path):
    path = ring_path(tmp_path)
    for junk in (b"{not json", b"[1, 2]", b'{"lines": "nope"}', json.dumps({"lines": ["ok", 3]}).encode()):
        path.write_bytes(junk)
        assert load(path) in ([], ["ok"])
    assert load(tmp_path / "missing.json") == []


def test_a_running_pipeline_records_the_lines_it_reads(tmp_path: Path):
    ring = EventRing(ring_path(tmp_path), save_every=3600)  # saved when the run ends
    pipeline = Pipeline(spec(), recent=ring)
    lines = [json.dumps({"ts": i, "user": "u", "v": i}) for i in range(10)]
    pipeline.run(iter(lines), chunk=4)
    assert load(ring_path(tmp_path)) == lines


def test_state_dir_of_a_version_directory(tmp_path: Path):
    assert state_dir_of(tmp_path / "versions" / "abc") == tmp_path.resolve()
    assert state_dir_of(tmp_path / "elsewhere") is None
    (tmp_path / "versions" / "abc").mkdir(parents=True)
    (tmp_path / "current").symlink_to("versions/abc")
    assert state_dir_of(tmp_path / "current") == tmp_path.resolve()


# --- the health check -------------------------------------------------------------------------
def _package(
    state_dir: Path, pipeline: dict, *, features: int, input_shape: list, declared: list | None = None
) -> Path:
    """A converted model (features -> 2 scores) unpacked as versions/v2 in an agent's state dir;
    ``declared`` replaces the input's shape in the manifest (a signature that promises more)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from converter import convert
    from engine.format import read_package
    from tests.model_packages import write_package

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((features, 2)).astype(np.float32), np.zeros(2, np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["features", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["scores"]),
        ],
        "tabular",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    convert(model, state_dir / "u.ferry")
    package = read_package(state_dir / "u.ferry")
    directory = state_dir / "versions" / "v2"
    directory.mkdir(parents=True)
    write_package(
        state_dir / "p.ferry",
        graph={k: v for k, v in package.graph.items() if k != "tensors"},
        tensors={k: np.array(v) for k, v in package.tensors.items()},
        inputs=[{**i, "shape": declared or i["shape"]} for i in package.manifest["inputs"]],
        outputs=package.manifest["outputs"],
        metadata={**package.manifest["metadata"], "pipeline": pipeline},
    )
    with tarfile.open(state_dir / "p.ferry") as tar:
        tar.extractall(directory, filter="data")
    return directory


def _two_feature_pipeline() -> dict:
    return spec(
        windows=[{"name": "w", "type": "tumbling", "size": 10, "field": "v", "aggregates": ["mean"]}],
        triggers=[{"name": "spike", "field": "kind", "sequence": ["low", "high"]}],
        features={"input": "features", "values": ["w.mean", "event.v"]},
        batch={"size": 4, "max_wait_ms": 20},
    )


def _real_events(state_dir: Path, count: int = 20) -> None:
    ring = EventRing(ring_path(state_dir), save_every=0)
    ring.extend(
        [
            json.dumps({"ts": i, "user": "m1", "kind": "low" if i % 2 == 0 else "high", "v": i})
            for i in range(count)
        ]
    )


def test_a_model_that_wants_other_features_than_its_pipeline_assembles_is_incompatible(tmp_path: Path):
    from agent.errors import IncompatibleModel
    from agent.install import health_check

    directory = _package(tmp_path, _two_feature_pipeline(), features=3, input_shape=["N", 3])
    with pytest.raises(
        IncompatibleModel, match=r"^incompatible: .*input 'features': dim 1 is 3 in the package, 2"
    ):
        health_check(directory)


def test_the_health_check_replays_recent_real_events_through_the_new_pipeline(tmp_path: Path):
    from agent.errors import IncompatibleModel
    from agent.install import health_check

    # the signature promises any feature count ("F"), so only running it on real events tells
    directory = _package(
        tmp_path, _two_feature_pipeline(), features=3, input_shape=["N", 3], declared=["N", "F"]
    )
    health_check(directory, recent_events=tmp_path / "none-yet.json")  # the package's own sample fits
    _real_events(tmp_path)
    with pytest.raises(
        IncompatibleModel, match=r"^incompatible: the model fails on \d+ feature row\(s\).* 20 recent"
    ):
        health_check(directory)


def test_a_model_that_fits_its_pipeline_passes_on_recent_events(tmp_path: Path):
    from agent.install import health_check

    directory = _package(tmp_path, _two_feature_pipeline(), features=2, input_shape=["N", 2])
    _real_events(tmp_path)
    before = os.stat(ring_path(tmp_path)).st_mtime_ns
    health_check(directory)
    assert os.stat(ring_path(tmp_path)).st_mtime_ns == before  # the check reads the ring, never writes it
