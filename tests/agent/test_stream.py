"""The declarative local stream pipeline: validation, parsing, windows, triggers, batching, sources."""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.stream import Pipeline, PipelineError, load_spec, postprocess, source_lines

BASE = {"version": 1, "source": {"type": "stdin"}, "parse": {"format": "json"}, "key_field": "user"}


def spec(**parts) -> dict:
    return {**BASE, **parts}


@pytest.mark.parametrize(
    "parts,message",
    [
        ({"source": {"type": "http"}}, "at source/type"),
        ({"parse": {"format": "csv"}}, "csv needs 'fields'"),
        ({"source": {"type": "file"}}, "needs 'path'"),
        ({"code": "import os"}, "Additional properties are not allowed"),
        ({"windows": [{"name": "w", "type": "sliding", "size": 10, "slide": 3, "field": "v"}]}, "divides"),
        ({"features": {"input": "x", "values": ["w9.mean"]}}, "names no window aggregate"),
        ({"filters": [{"field": "k", "op": "regex", "value": ".*"}]}, "at filters/0/op"),
    ],
)
def test_invalid_specs_are_refused_with_where(parts, message):
    with pytest.raises(PipelineError, match=message):
        load_spec(spec(**parts))


def test_yaml_and_json_files_load(tmp_path: Path):
    (tmp_path / "p.yaml").write_text("version: 1\nsource: {type: stdin}\nparse: {format: json}\n")
    (tmp_path / "p.json").write_text(json.dumps(BASE))
    assert load_spec(tmp_path / "p.yaml")["parse"] == {"format": "json"}
    assert load_spec(tmp_path / "p.json")["key_field"] == "user"


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


def _reference_firings(events: list[dict], triggers: list[dict]) -> list[tuple]:
    """Brute force: at each event, does the key's recent history end with a pattern (within its time)?"""
    history: dict[str, list] = {}
    fired = []
    for e in events:
        h = history.setdefault(e["user"], [])
        h.append((e["kind"], e["ts"]))
        for t in triggers:
            n = len(t["sequence"])
            tail = h[-n:]
            matches = len(tail) == n and [k for k, _ in tail] == t["sequence"]
            if matches and (t.get("within") is None or e["ts"] - tail[0][1] <= t["within"]):
                fired.append((e["user"], t["name"], e["ts"]))
    return fired


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_many_triggers_in_one_pass_match_a_brute_force_reference(seed: int):
    rng = random.Random(seed)
    kinds = ["a", "b", "c", "d"]
    triggers = [
        {"name": f"t{i}", "field": "kind", "sequence": [rng.choice(kinds) for _ in range(rng.randint(1, 4))]}
        for i in range(40)
    ]
    for t in triggers[::3]:
        t["within"] = 2.5
    events, ts = [], 0.0
    for _ in range(3000):
        ts += rng.random()
        events.append({"ts": ts, "user": rng.choice(["u1", "u2", "u3"]), "kind": rng.choice(kinds)})
    pipeline = Pipeline(spec(triggers=triggers))
    fired = []
    for i in range(0, len(events), 256):
        fired += pipeline.feed([json.dumps(e) for e in events[i : i + 256]])
    assert [(f["key"], f["trigger"], f["ts"]) for f in fired] == _reference_firings(events, triggers)


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


class _Reader:
    """Reads a source on its own thread; the test waits on the source's readiness and on lines."""

    def __init__(self, source: dict, poll: float = 0.02) -> None:
        self.stop, self.ready = threading.Event(), threading.Event()
        self.lines: queue.Queue[str] = queue.Queue()
        self.idle = threading.Event()  # set when the source has yielded everything it had
        self._thread = threading.Thread(target=self._read, args=(source, poll))
        self._thread.start()
        assert self.ready.wait(10), "the source never became ready"

    def _read(self, source: dict, poll: float) -> None:
        for line in source_lines(source, self.stop, poll, ready=self.ready):
            if line:
                self.lines.put(line)
            else:  # "" means "nothing new right now"
                self.idle.set()

    def take(self, n: int) -> list[str]:
        return [self.lines.get(timeout=10) for _ in range(n)]

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()


def test_file_source_tails_appended_lines_and_follows_rotation(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"old": true}\n')
    reader = _Reader({"type": "file", "path": str(path)})  # ready: open and at the end
    try:
        with open(path, "a") as f:
            f.write('{"n": 1}\n{"n":')
            f.flush()
            assert reader.take(1) == ['{"n": 1}\n']
            reader.idle.clear()
            assert reader.idle.wait(10)  # the source has read the partial line, and holds it
            f.write(" 2}\n")
        assert reader.take(1) == ['{"n": 2}\n']
        path.rename(tmp_path / "events.jsonl.1")
        path.write_text('{"n": 3}\n')
        assert reader.take(1) == ['{"n": 3}\n']
    finally:
        reader.close()


def test_a_file_created_after_the_source_started_is_read_from_its_start(tmp_path: Path):
    path = tmp_path / "late.jsonl"
    reader = _Reader({"type": "file", "path": str(path)})
    try:
        # written in one go before the source's next look: nothing of it may be skipped
        path.write_text('{"n": 1}\n{"n": 2}\n')
        assert reader.take(2) == ['{"n": 1}\n', '{"n": 2}\n']
    finally:
        reader.close()


def test_unix_socket_and_directory_sources(tmp_path: Path):
    sock_path = str(tmp_path / "in.sock")
    reader = _Reader({"type": "unix_socket", "path": sock_path})  # ready: listening
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(sock_path)
            client.sendall(b'{"a": 1}\n{"a": 2}\n')
        assert reader.take(2) == ['{"a": 1}\n', '{"a": 2}\n']
    finally:
        reader.close()
    assert not Path(sock_path).exists()  # nobody listens any more: no path to be refused at

    (tmp_path / "drop").mkdir()
    (tmp_path / "drop" / "1.jsonl").write_text('{"b": 1}\n')
    reader = _Reader({"type": "directory", "path": str(tmp_path / "drop")})
    try:
        assert reader.take(1) == ['{"b": 1}\n']
        (tmp_path / "drop" / "2.jsonl").write_text('{"b": 2}\n')
        assert reader.take(1) == ['{"b": 2}\n']
    finally:
        reader.close()


def test_a_unix_socket_path_appears_only_once_it_listens(tmp_path: Path):
    """The CI flake: a producer that connects as soon as the path exists was refused, because
    bind() creates the path before listen().  This stops the source's thread just before its
    listen() call (a profile hook sees every C call) and connects then, as such a producer
    would: with bind-then-listen at the public path the connection is refused."""
    sock_path = str(tmp_path / "in.sock")
    Path(sock_path).write_text("a stale file a previous run left behind")
    seen_before_listen: list[str] = []

    def before_listen(frame, event, arg) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "listen":
            seen_before_listen.append(_connect_outcome(sock_path))

    stop, ready = threading.Event(), threading.Event()

    def read() -> None:
        sys.setprofile(before_listen)  # this thread only
        try:
            for _ in source_lines({"type": "unix_socket", "path": sock_path}, stop, ready=ready):
                pass
        finally:
            sys.setprofile(None)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        assert ready.wait(10)
        assert seen_before_listen == ["stale"]  # a client still found only the old file
        assert _connect_outcome(sock_path) == "connected"
    finally:
        stop.set()
        thread.join(timeout=10)


def _connect_outcome(path: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        try:
            client.connect(path)
        except FileNotFoundError:
            return "missing"
        except ConnectionRefusedError:
            return "refused" if stat.S_ISSOCK(os.stat(path).st_mode) else "stale"
    return "connected"


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


def _tabular_package(tmp_path: Path, pipeline: dict) -> Path:
    """A small converted model (8 features -> 2 scores) whose manifest carries a pipeline."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from converter import convert
    from engine.format import read_package, write_package

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
