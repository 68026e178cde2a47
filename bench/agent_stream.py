"""Throughput of the agent's local stream pipeline, and of batched vs per-event inference.

1. parse → filter → window → trigger, one core (one Python thread, BLAS pinned to one thread):
   events per CPU-second (process time, best of 3, so other load on the machine counts less)
   for JSON lines and CSV lines through agent.stream.Pipeline (chunked parsing,
   a tumbling and a sliding window per key, 64 trigger sequences in one trie), next to the
   naive peer: the same work written as a plain per-line loop (json.loads per line, one
   regex-free pattern check per trigger per event).
2. inference on a small tabular model (8 features → 32 → 4, converted to a Ferry package):
   rows/s with the engine at batch 1 (one call per event) and batched, next to onnxruntime.

    .venv/bin/python bench/agent_stream.py [--events 400000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from agent.stream import Pipeline  # noqa: E402

KINDS = ["view", "click", "buy", "login", "logout", "error", "scroll", "search"]


def events(n: int, users: int = 1000, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    ts = 1_700_000_000.0
    out = []
    for _ in range(n):
        ts += rng.random() * 0.01
        out.append(
            {
                "ts": round(ts, 3),
                "user": f"u{rng.randrange(users)}",
                "kind": rng.choice(KINDS),
                "value": rng.random(),
            }
        )
    return out


def triggers(count: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "name": f"t{i}",
            "field": "kind",
            "sequence": [rng.choice(KINDS) for _ in range(rng.randint(2, 4))],
            "within": 30,
        }
        for i in range(count)
    ]


def spec(fmt: str, trigger_count: int) -> dict:
    parse = (
        {"format": "json"} if fmt == "json" else {"format": "csv", "fields": ["ts", "user", "kind", "value"]}
    )
    return {
        "version": 1,
        "source": {"type": "stdin"},
        "parse": parse,
        "time_field": "ts",
        "key_field": "user",
        "filters": [{"field": "kind", "op": "ne", "value": "scroll"}],
        "windows": [
            {
                "name": "w10",
                "type": "tumbling",
                "size": 10,
                "field": "value",
                "aggregates": ["count", "mean"],
            },
            {
                "name": "s30",
                "type": "sliding",
                "size": 30,
                "slide": 10,
                "field": "value",
                "aggregates": ["mean"],
            },
        ],
        "triggers": triggers(trigger_count),
    }


def best_of(runs: int, measure, *args) -> tuple[float, int]:
    results = [measure(*args) for _ in range(runs)]
    return max(r[0] for r in results), results[0][1]


def run_pipeline(lines: list[str], fmt: str, trigger_count: int) -> tuple[float, int]:
    pipeline = Pipeline(spec(fmt, trigger_count))
    started = time.process_time()  # CPU time of this (single-threaded) process: one core's work
    stats = pipeline.run(lines, chunk=4096)
    elapsed = time.process_time() - started
    return len(lines) / elapsed, stats.triggers


def run_naive(lines: list[str], trigger_count: int) -> tuple[float, int]:
    """The straightforward loop: parse each line, keep per-key state, test every pattern's tail."""
    patterns = [(t["sequence"], t["within"]) for t in triggers(trigger_count)]
    longest = max(len(p) for p, _ in patterns)
    history: dict[str, list] = {}
    windows: dict[str, list] = {}
    fired = 0
    started = time.process_time()
    for line in lines:
        e = json.loads(line)
        if e["kind"] == "scroll":
            continue
        ts, key = float(e["ts"]), e["user"]
        start = ts - ts % 10
        w = windows.get(key)
        if w is None or w[0] != start:
            windows[key] = [start, 1, e["value"]]
        else:
            w[1] += 1
            w[2] += e["value"]
        h = history.setdefault(key, [])
        h.append((e["kind"], ts))
        del h[:-longest]
        for seq, within in patterns:
            n = len(seq)
            if len(h) >= n and [k for k, _ in h[-n:]] == seq and ts - h[-n][1] <= within:
                fired += 1
    return len(lines) / (time.process_time() - started), fired


def tabular_model():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((8, 32)).astype(np.float32), np.zeros(32, np.float32)
    w2, b2 = rng.standard_normal((32, 4)).astype(np.float32), np.zeros(4, np.float32)
    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["scores"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tabular",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what onnxruntime accepts
    return model


def rows_per_second(run, rows: np.ndarray, batch: int, seconds: float = 1.5) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for i in range(0, len(rows), batch):
            run(rows[i : i + batch])
            done += len(rows[i : i + batch])
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--triggers", type=int, default=64)
    args = parser.parse_args()
    data = events(args.events)
    json_lines = [json.dumps(e) for e in data]
    csv_lines = [f"{e['ts']},{e['user']},{e['kind']},{e['value']}" for e in data]
    # The bench holds every input line in memory, which a device never does: keep the cyclic
    # collector from rescanning that test data during the runs (same for every row).
    del data
    gc.collect()
    gc.freeze()

    with threadpool_limits(1):
        print(f"\nstream: parse → filter → window → trigger, {args.events} events, {args.triggers} triggers")
        print(f"{'implementation':<44} {'events/cpu-s':>12} {'triggers fired':>15}")
        for name, (rate, fired) in [
            ("ferry pipeline, JSON lines", best_of(3, run_pipeline, json_lines, "json", args.triggers)),
            ("ferry pipeline, CSV lines", best_of(3, run_pipeline, csv_lines, "csv", args.triggers)),
            ("naive per-line loop (peer), JSON lines", best_of(3, run_naive, json_lines, args.triggers)),
        ]:
            print(f"{name:<44} {rate:>12,.0f} {fired:>15,}")

        from converter import convert
        from engine import Session

        with tempfile.TemporaryDirectory() as tmp:
            model = tabular_model()
            convert(model, Path(tmp) / "t.ferry")
            session = Session(Path(tmp) / "t.ferry", threads=1)
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            ort_session = ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            rows = np.random.default_rng(1).standard_normal((4096, 8)).astype(np.float32)
            print("\ninference: tabular model 8 → 32 → 4, 1 thread")
            print(f"{'engine':<16} {'batch':>6} {'rows/s':>12}")
            for batch in (1, 32, 256):
                ferry = rows_per_second(lambda x: session.run({"features": x}), rows, batch)
                onnx_rt = rows_per_second(lambda x: ort_session.run(None, {"features": x}), rows, batch)
                print(f"{'ferry':<16} {batch:>6} {ferry:>12,.0f}")
                print(f"{'onnxruntime':<16} {batch:>6} {onnx_rt:>12,.0f}")


if __name__ == "__main__":
    main()
