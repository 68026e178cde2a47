"""Run the active model on the device's event stream and keep the figures telemetry reports.

For now the stream is synthetic (seeded random inputs shaped like the model's
inputs, at a fixed rate); the declarative pipeline of sources, windows and
triggers that a package will carry plugs in here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine import Session
from engine.errors import EngineError

log = logging.getLogger(__name__)


@dataclass
class Figures:
    """What happened since the last report."""

    inferences: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else None
        return {
            "inferences": self.inferences,
            "errors": self.errors,
            "latency_ms_p50": None if lat is None else round(float(np.percentile(lat, 50)), 4),
            "latency_ms_p95": None if lat is None else round(float(np.percentile(lat, 95)), 4),
        }


def _concrete(shape: list) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else 1 for d in shape]


class InferenceLoop:
    """A thread that feeds events to whichever model is active, at `rate` events per second."""

    def __init__(self, rate: float = 20.0, seed: int = 0) -> None:
        self.rate = rate
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._version = ""
        self._figures = Figures()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)

    def load(self, directory: Path, version_id: str) -> None:
        session = Session(directory, threads=1)
        with self._lock:
            self._session, self._version = session, version_id

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
        self._stop.set()
        self._thread.join(timeout=5)

    def _event(self, session: Session) -> dict[str, np.ndarray]:
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
            if session is not None:
                self._infer_once(session)
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _infer_once(self, session: Session) -> None:
        feeds = self._event(session)
        started = time.perf_counter()
        try:
            session.run(feeds)
            ok = True
        except EngineError as exc:
            log.warning("inference failed: %s", exc)
            ok = False
        elapsed_ms = 1000 * (time.perf_counter() - started)
        with self._lock:
            if session is not self._session:
                return  # the model changed under this event: count it for nobody
            if ok:
                self._figures.inferences += 1
                self._figures.latencies_ms.append(elapsed_ms)
            else:
                self._figures.errors += 1
