"""The pipeline: parse → filter → windows → triggers → features → batch → infer → post-process → sinks."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agent.stream.parsing import make_filter, make_parser
from agent.stream.recent import EventRing
from agent.stream.spec import AGGREGATES, load_spec
from agent.stream.triggers import TriggerTrie
from agent.stream.windows import Window

log = logging.getLogger(__name__)


@dataclass
class Stats:
    events_in: int = 0
    malformed: int = 0
    filtered_out: int = 0
    triggers: int = 0
    inferences: int = 0
    batches: int = 0
    inference_errors: int = 0


class Pipeline:
    """parse → filter → windows → triggers → features → batch → infer → post-process → sinks."""

    def __init__(
        self,
        spec: dict[str, Any],
        *,
        infer: Callable[[Any], Any] | None = None,
        sinks: list[Callable[[dict], None]] | None = None,
        recent: EventRing | None = None,
    ) -> None:
        self.spec = load_spec(spec)
        self.recent = recent  # the last raw lines, kept for the next version's health check
        self.parse = make_parser(self.spec)
        self.keep = make_filter(self.spec)
        self.time_field = self.spec.get("time_field", "ts")
        self.key_field = self.spec.get("key_field", "")
        self.windows = [
            Window(
                name=w["name"],
                size=float(w["size"]),
                field=w["field"],
                aggregates=tuple(w.get("aggregates", AGGREGATES)),
                slide=float(w["slide"]) if w["type"] == "sliding" else None,
            )
            for w in self.spec.get("windows", [])
        ]
        self.by_name = {w.name: w for w in self.windows}
        self.trie = TriggerTrie(self.spec.get("triggers", []))
        features = self.spec.get("features")
        self.feature_refs = [v.partition(".")[::2] for v in features["values"]] if features else []
        batch = self.spec.get("batch", {})
        self.batch_size = int(batch.get("size", 32))
        self.max_wait = float(batch.get("max_wait_ms", 50)) / 1000
        self.infer = infer
        self.sinks = sinks if sinks is not None else []
        self.stats = Stats()
        self._rows: list[list[float]] = []
        self._row_meta: list[dict[str, Any]] = []
        self._first_row_at = 0.0

    # the hot loop: one chunk of raw lines at a time
    def feed(self, lines: list[str]) -> list[dict[str, Any]]:
        """Process a chunk of lines; returns the trigger firings (key, trigger, ts) in order."""
        # A chunk allocates thousands of short-lived dicts and no reference cycles: pausing the
        # cyclic collector for it saves its repeated scans (reference counting still frees all).
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._feed(lines)
        finally:
            if collecting:
                gc.enable()

    def _feed(self, lines: list[str]) -> list[dict[str, Any]]:
        events, bad = self.parse(lines)
        stats = self.stats
        stats.events_in += len(lines)
        stats.malformed += bad
        keep = self.keep
        if keep is not None:
            before = len(events)
            events = keep(events)
            stats.filtered_out += before - len(events)
        time_field, key_field = self.time_field, self.key_field
        # the hot loop, with the window update and the automaton step inlined (method calls per
        # event would cost about a third of the throughput); Window.add and TriggerTrie.step
        # are the readable versions of the same code
        windows = [(w.open, w.field, w.pane, w) for w in self.windows]
        trie = self.trie
        trigger_field, states, moves, history = trie.field, trie.keys, trie._moves, trie.history
        fired_all: list[dict[str, Any]] = []
        for event in events:
            try:
                ts = float(event[time_field])
            except (KeyError, TypeError, ValueError):
                stats.malformed += 1
                continue
            key = event.get(key_field) if key_field else None
            for opened, name, pane, window in windows:
                value = event.get(name)
                if value is None:
                    continue
                value = float(value)
                state = opened.get(key)
                if state is not None and state[0] == ts - ts % pane:
                    state[1] += 1
                    state[2] += value
                    if value < state[3]:
                        state[3] = value
                    elif value > state[4]:
                        state[4] = value
                else:
                    window.add(key, ts, value)
            if not trigger_field:
                continue
            symbol = event.get(trigger_field)
            if symbol is None:
                continue
            current = states.get(key, 0)
            move = moves[current].get(symbol) or trie._move(current, symbol)
            states[key] = move[0]
            if history:
                times = trie.times.get(key)
                if times is None:
                    times = trie.times[key] = deque(maxlen=history)
                times.append(ts)
            if move[1]:
                for name, within, length in move[1]:
                    if within is not None and ts - times[-length] > within:
                        continue
                    stats.triggers += 1
                    firing = {"key": key, "trigger": name, "ts": ts}
                    fired_all.append(firing)
                    if self.feature_refs:
                        self._queue(firing, event)
        if self._rows and (
            len(self._rows) >= self.batch_size or time.monotonic() - self._first_row_at >= self.max_wait
        ):
            self.flush()
        return fired_all

    def features_for(self, key: Any, event: dict[str, Any]) -> list[float]:
        row = []
        for source, name in self.feature_refs:
            if source == "event":
                row.append(float(event.get(name, 0.0)))
            else:
                row.append(float(self.by_name[source].current(key)[name]))
        return row

    def _queue(self, firing: dict[str, Any], event: dict[str, Any]) -> None:
        if not self._rows:
            self._first_row_at = time.monotonic()
        self._rows.append(self.features_for(firing["key"], event))
        self._row_meta.append(firing)
        if len(self._rows) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Run the model on the queued rows as one batch and send the results to the sinks."""
        if not self._rows:
            return
        rows, meta = self._rows, self._row_meta
        self._rows, self._row_meta = [], []
        if self.infer is None:
            return
        try:
            outputs = self.infer(rows)
        except Exception as exc:  # the model's failure is counted and reported, the stream goes on
            self.stats.inference_errors += len(rows)
            log.warning("batched inference failed: %s", exc)
            return
        self.stats.batches += 1
        self.stats.inferences += len(rows)
        for firing, scores in zip(meta, outputs, strict=False):
            result = {**firing, **postprocess(scores, self.spec.get("postprocess", {}))}
            for sink in self.sinks:
                sink(result)

    def run(self, lines: Iterable[str], chunk: int = 2048, stop: threading.Event | None = None) -> Stats:
        """Feed lines in chunks.  A live source yields "" when it has nothing right now: the
        partial chunk is processed then, and a batch waiting longer than max_wait_ms is run."""
        buffer: list[str] = []
        for line in lines:
            if line:
                buffer.append(line)
                if len(buffer) < chunk:
                    continue
            if buffer:
                self.feed(buffer)
                self._remember(buffer)
                buffer = []
            if not line and self._rows and time.monotonic() - self._first_row_at >= self.max_wait:
                self.flush()
            if not line and self.recent is not None:
                self.recent.save_if_due()
            if stop is not None and stop.is_set():
                break
        if buffer:
            self.feed(buffer)
            self._remember(buffer)
        self.flush()
        if self.recent is not None:
            self.recent.save()
        return self.stats

    def _remember(self, lines: list[str]) -> None:
        if self.recent is not None:
            self.recent.extend(lines)


def postprocess(scores: Any, rules: dict[str, Any]) -> dict[str, Any]:
    """Threshold, top-k and label map over one row of model output."""
    values = [float(v) for v in (scores.tolist() if hasattr(scores, "tolist") else scores)]
    values = values if isinstance(values, list) else [values]
    labels = rules.get("labels") or [str(i) for i in range(len(values))]
    ranked = sorted(range(len(values)), key=values.__getitem__, reverse=True)[: rules.get("top_k", 1)]
    top = [
        {"label": labels[i] if i < len(labels) else str(i), "index": i, "score": values[i]} for i in ranked
    ]
    result: dict[str, Any] = {"top": top}
    if "threshold" in rules:
        result["alert"] = bool(top and top[0]["score"] >= rules["threshold"])
    return result


def engine_infer(session: Any, input_name: str) -> Callable[[list[list[float]]], Any]:
    """Batched inference with the engine: one call per batch of feature rows."""
    import numpy as np

    def infer(rows: list[list[float]]):
        feeds = {input_name: np.asarray(rows, dtype=np.float32)}
        return next(iter(session.run(feeds).values()))

    return infer
