"""Run the active model on the device's event stream and keep the figures telemetry reports.

numpy and the engine are imported when the first model is loaded, not before.
When the active package's signed manifest carries a pipeline (``metadata.pipeline``, see
agent/stream.py), its source feeds the model through windows and triggers, batched.
Without one, the stream is synthetic (seeded random inputs shaped like the model's
inputs, at a fixed rate), which the demo uses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Upper bounds (ms) of the latency histogram buckets; the last bucket is open-ended.
LATENCY_BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 250, 1000)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), without importing numpy."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_histogram(latencies_ms: list[float]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for value in latencies_ms:
        bucket = next((f"le_{b:g}" for b in LATENCY_BUCKETS_MS if value <= b), "gt_1000")
        counts[bucket] += 1
    return dict(counts)


@dataclass
class Figures:
    """What happened since the last report."""

    inferences: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    top1: Counter = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        p50, p95 = percentile(self.latencies_ms, 50), percentile(self.latencies_ms, 95)
        return {
            "inferences": self.inferences,
            "errors": self.errors,
            "latency_ms_p50": None if p50 is None else round(p50, 4),
            "latency_ms_p95": None if p95 is None else round(p95, 4),
            "latency_ms_histogram": latency_histogram(self.latencies_ms),
            "top1_histogram": {str(k): v for k, v in sorted(self.top1.items())},
        }


def _concrete(shape: list) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else 1 for d in shape]


class PipelineRunner:
    """One version's declarative pipeline on its own thread: source → ... → batched engine → sinks."""

    def __init__(
        self, spec: dict, session, version_id: str, loop: InferenceLoop, emit=None, recent=None
    ) -> None:
        from agent import stream

        self.version_id = version_id
        self._stop = threading.Event()
        features = spec.get("features") or {}
        infer = stream.engine_infer(session, features.get("input", session.inputs[0].name))
        sinks = [loop.count_result]
        for sink in spec.get("sinks", []):
            if sink["type"] == "file":
                sinks.append(stream.file_sink(sink["path"]))
            elif sink["type"] == "socket":
                sinks.append(stream.socket_sink(sink["path"]))
            elif sink["type"] == "telemetry" and emit is not None:
                sinks.append(lambda result: emit("event", {"pipeline": result}, version_id))
        self.pipeline = stream.Pipeline(spec, infer=loop.timed(infer, version_id), sinks=sinks, recent=recent)
        self._thread = threading.Thread(
            target=self._run, args=(spec["source"],), name="pipeline", daemon=True
        )
        self._thread.start()

    def _run(self, source: dict) -> None:
        from agent import stream

        try:
            self.pipeline.run(stream.source_lines(source, self._stop), stop=self._stop)
        except Exception:  # a broken source must not take the agent down; it is logged and counted
            log.exception("pipeline of %s stopped", self.version_id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class InferenceLoop:
    """A thread that feeds events to whichever model is active, at `rate` events per second
    (or a PipelineRunner, when the package declares a pipeline)."""

    def __init__(self, rate: float = 20.0, seed: int = 0, emit=None) -> None:
        self.rate = rate
        self.emit = emit  # (kind, payload, version_id) -> None: the telemetry sink
        self._runner: PipelineRunner | None = None
        self.seed = seed
        self._rng = None  # numpy's generator, made when a model is first loaded
        self._lock = threading.Lock()
        self._session = None  # engine.Session
        self._version = ""
        self._figures = Figures()
        self._stop = threading.Event()
        self._loaded = threading.Event()  # set while a model is loaded, or to stop
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)

    def load(self, directory: Path, version_id: str) -> None:
        """Make version_id the active model (version_id '' unloads)."""
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
        if not version_id:
            with self._lock:
                self._session, self._version = None, ""
                self._loaded.clear()
            return
        import numpy as np

        from engine import Session

        session = Session(directory, threads=1)
        spec = pipeline_spec(directory)
        with self._lock:
            if self._rng is None:
                self._rng = np.random.default_rng(self.seed)
            self._version = version_id
            if spec is None:
                self._session = session
                self._loaded.set()
            else:  # the pipeline drives the model; the synthetic stream sleeps
                self._session = None
                self._loaded.clear()
        if spec is not None:
            self._runner = PipelineRunner(spec, session, version_id, self, self.emit, _recent_ring(directory))
            log.info("pipeline of %s reads from %s", version_id, spec["source"]["type"])

    def timed(self, infer, version_id: str):
        """Wrap batched inference so its latency and errors land in the figures."""

        def run(rows):
            started = time.perf_counter()
            try:
                out = infer(rows)
            except Exception:
                with self._lock:
                    if self._version == version_id:
                        self._figures.errors += len(rows)
                raise
            elapsed_ms = 1000 * (time.perf_counter() - started)
            with self._lock:
                if self._version == version_id:
                    self._figures.inferences += len(rows)
                    self._figures.latencies_ms.append(elapsed_ms)  # per batch
            return out

        return run

    def count_result(self, result: dict) -> None:
        top = result.get("top") or []
        if top:
            with self._lock:
                self._figures.top1[top[0]["index"]] += 1

    @property
    def version(self) -> str:
        return self._version

    def take_figures(self) -> tuple[str, dict]:
        with self._lock:
            figures, self._figures = self._figures, Figures()
            return self._version, figures.summary()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.stop()
        self._stop.set()
        self._loaded.set()
        self._thread.join(timeout=5)

    def _event(self, session) -> dict[str, Any]:
        return {
            spec.name: self._rng.standard_normal(_concrete(spec.shape)).astype(spec.dtype)
            for spec in session.inputs
        }

    def _run(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                session = self._session
            if session is None:
                # no model: sleep until one is loaded (an idle agent must cost ~0% CPU)
                self._loaded.wait()
                next_at = time.monotonic()
                continue
            self._infer_once(session)
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _infer_once(self, session) -> None:
        from engine.errors import EngineError

        feeds = self._event(session)
        started = time.perf_counter()
        top1 = None
        try:
            outputs = session.run(feeds)
            first = next(iter(outputs.values()), None)
            if first is not None and first.size:
                top1 = int(first.reshape(first.shape[0] if first.ndim > 1 else 1, -1)[0].argmax())
            ok = True
        except EngineError as exc:
            log.warning("inference failed: %s", exc)
            ok = False
        except Exception as exc:  # the model misbehaves: count it, keep the loop alive
            log.warning("inference failed: %s: %s", type(exc).__name__, exc)
            ok = False
        elapsed_ms = 1000 * (time.perf_counter() - started)
        with self._lock:
            if session is not self._session:
                return  # the model changed under this event: count it for nobody
            if ok:
                self._figures.inferences += 1
                self._figures.latencies_ms.append(elapsed_ms)
                if top1 is not None:
                    self._figures.top1[top1] += 1
            else:
                self._figures.errors += 1


def _recent_ring(directory: Path):
    """The ring of recent events a pipeline keeps for the next health check (agent/stream/recent.py),
    when the version is unpacked in an agent's state directory."""
    from agent.stream.recent import EventRing, ring_path, state_dir_of

    state_dir = state_dir_of(directory)
    return None if state_dir is None else EventRing(ring_path(state_dir))


def pipeline_spec(directory: Path) -> dict | None:
    """The package's validated pipeline spec (from its signed manifest), or None."""
    from deploy.package import read_unpacked

    manifest = read_unpacked(directory)
    spec = (manifest.get("metadata") or {}).get("pipeline")
    if spec is None:
        return None
    from agent.stream import load_spec

    return load_spec(spec)
