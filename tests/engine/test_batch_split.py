"""A multi-thread session runs a batched signature as one-thread parts on as many threads
(engine/batch_split.py), only where the first run's outputs showed the parts give the same."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter.translate import node_dict
from engine import Session, batch_split
from engine import plan_threads as pt
from tests.engine.helpers import run_reference
from tests.model_packages import write_package


def _batched_package(model: onnx.ModelProto, path: Path, feeds: dict[str, np.ndarray]) -> Path:
    """A package whose inputs have a symbolic leading dim ("batch"), as exporters write it."""
    graph = model.graph
    write_package(
        path,
        graph={
            "nodes": [
                node_dict(node, node.name or f"{node.op_type}_{i}") for i, node in enumerate(graph.node)
            ],
            "inputs": list(feeds),
            "outputs": [o.name for o in graph.output],
            "opset": 17,
        },
        tensors={init.name: numpy_helper.to_array(init) for init in graph.initializer},
        inputs=[
            {"name": k, "dtype": v.dtype.name, "shape": ["batch", *v.shape[1:]]} for k, v in feeds.items()
        ],
        outputs=[{"name": o.name, "dtype": "float32", "shape": None} for o in graph.output],
    )
    return path


def _model(
    nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_block(batch: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv -> Relu -> MatMul with a second batched input: per-item, so it splits."""
    rng = np.random.default_rng(5)
    feeds = {
        "x": rng.standard_normal((batch, 4, 10, 10)).astype(np.float32),
        "z": rng.standard_normal((batch, 8, 10, 3)).astype(np.float32),
    }
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MatMul", ["r", "z"], ["y"]),
    ]
    return _model(nodes, feeds, {"w": w}), feeds


def _run_many(session: Session, feeds: dict[str, np.ndarray], runs: int) -> list[np.ndarray]:
    return [session.run(feeds)["y"] for _ in range(runs)]


def test_a_per_item_graph_runs_in_parts_with_the_same_results(tmp_path):
    model, feeds = _conv_block(4)
    session = Session(_batched_package(model, tmp_path / "m.ferry", feeds), threads=2)
    want = run_reference(model, feeds)[0]
    # whole (the reference), checked and split, then split runs timed on 2 threads and on 1
    for got in _run_many(session, feeds, 2 + 2 * pt.FIRST_SAMPLES + 2):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert list(session._splits.values()) == [2]
    (choice,) = session._thread_choices.values()  # the parts' plan itself is never run whole
    assert all(len(choice.times[n]) >= pt.FIRST_SAMPLES for n in (2, 1))
    # other values of the same shape take the split path too, and still match
    other = {k: v[::-1].copy() for k, v in feeds.items()}
    np.testing.assert_allclose(session.run(other)["y"], run_reference(model, other)[0], rtol=1e-4, atol=1e-4)
    # a profile times the parts' nodes one part after another
    ops = [t.op for t in session.profile(feeds)]
    assert ops.count("Conv") + ops.count("FusedConv") == 2


def test_a_graph_that_mixes_the_batch_runs_whole(tmp_path):
    """x - mean over the batch: same shapes in parts, other values; the check refuses the split."""
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 6)).astype(np.float32)}
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    model = _model(nodes, feeds, {})
    session = Session(_batched_package(model, tmp_path / "m.ferry", feeds), threads=2)
    want = run_reference(model, feeds)[0]
    for got in _run_many(session, feeds, 4):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert list(session._splits.values()) == [0]


def test_a_batch_baked_into_a_reshape_runs_whole(tmp_path):
    """A Reshape to a constant [2, -1]: a part of batch 1 comes out another shape."""
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = _model(nodes, feeds, {"shape": np.array([2, -1], np.int64)})
    session = Session(_batched_package(model, tmp_path / "m.ferry", feeds), threads=2)
    for got in _run_many(session, feeds, 3):
        np.testing.assert_array_equal(got, feeds["x"].reshape(2, -1))
    assert list(session._splits.values()) == [0]


def test_one_thread_or_a_fixed_batch_never_splits(tmp_path):
    model, feeds = _conv_block(2)
    session = Session(_batched_package(model, tmp_path / "m.ferry", feeds), threads=1)
    _run_many(session, feeds, 3)
    assert session._splits == {}
    spec = [SimpleNamespace(name="x", shape=[2, 4, 10, 10]), SimpleNamespace(name="z", shape=None)]
    assert batch_split.part_count(spec, feeds, 2) == 0


def _specs(feeds: dict[str, np.ndarray]) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=k, shape=["batch", *v.shape[1:]]) for k, v in feeds.items()]


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 12), threads=st.integers(1, 5), width=st.integers(1, 4))
def test_parts_divide_the_batch_and_join_back(batch, threads, width):
    feeds = {
        "a": np.arange(batch * width, dtype=np.float32).reshape(batch, width),
        "b": np.arange(batch, dtype=np.int64),
    }
    parts = batch_split.part_count(_specs(feeds), feeds, threads)
    if parts == 0:
        assert threads < 2 or all(batch % k for k in range(2, min(threads, batch) + 1))
        return
    assert 2 <= parts <= min(threads, batch) and batch % parts == 0
    pieces = batch_split.split(feeds, parts)
    assert all(p["a"].shape[0] == batch // parts for p in pieces)
    joined = batch_split.join(pieces)
    assert all(np.array_equal(joined[k], feeds[k]) for k in feeds)


def test_leading_dims_that_differ_do_not_split():
    feeds = {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4,), np.float32)}
    assert batch_split.part_count(_specs(feeds), feeds, 2) == 0
    scalar = {"a": np.zeros((2, 3), np.float32), "b": np.float32(1.0) * np.ones(())}
    assert batch_split.part_count(_specs(scalar), scalar, 2) == 0


def test_the_caller_runs_the_parts_no_pool_thread_has_started():
    """The pool busy (another session's parts, a parked thread): the run does not wait for it."""
    release = threading.Event()
    pool = batch_split._workers()
    blockers = [pool.submit(release.wait) for _ in range(pool._max_workers)]
    try:
        ran_on: list[int] = []

        def run(piece: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            ran_on.append(threading.get_ident())
            return {"y": piece["x"] * 2}

        feeds = {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}
        joined = batch_split.join(batch_split.run_parts(run, batch_split.split(feeds, 3)))
        np.testing.assert_array_equal(joined["y"], feeds["x"] * 2)
        assert set(ran_on) == {threading.get_ident()}
    finally:
        release.set()
        for blocker in blockers:
            blocker.result()


def test_a_failing_part_fails_the_run():
    def run(piece: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if piece["x"][0, 0] > 0:
            raise ValueError("part failed")
        return {"y": piece["x"]}

    feeds = {"x": np.arange(4, dtype=np.float32).reshape(2, 2)}
    try:
        batch_split.run_parts(run, batch_split.split(feeds, 2))
    except ValueError as exc:
        assert "part failed" in str(exc)
    else:
        raise AssertionError("the failing part was not reported")


def test_outputs_that_disagree_in_dtype_or_values_do_not_agree():
    want = {"y": np.ones(3, np.float32)}
    assert batch_split.agree({"y": np.ones(3, np.float32) + 1e-7}, want)
    assert not batch_split.agree({"y": np.ones(3, np.float64)}, want)
    assert not batch_split.agree({"y": np.full(3, 1.1, np.float32)}, want)
    assert not batch_split.agree({}, want)
    assert not batch_split.agree({"i": np.array([1, 2])}, {"i": np.array([1, 3])})


def test_share_out_runs_every_item_once_and_the_caller_takes_over_a_busy_pool():
    done: list[int] = []
    batch_split.share_out(done.append, range(10), 2)
    assert sorted(done) == list(range(10))
    release = threading.Event()
    pool = batch_split._workers()
    blockers = [pool.submit(release.wait) for _ in range(pool._max_workers)]
    try:
        ran_on: set[int] = set()
        batch_split.share_out(lambda item: ran_on.add(threading.get_ident()), range(4), 2)
        assert ran_on == {threading.get_ident()}  # nothing waited for the blocked pool
    finally:
        release.set()
        for blocker in blockers:
            blocker.result()
