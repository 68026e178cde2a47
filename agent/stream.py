"""Local stream processing (Walle's data pipeline): a declarative spec, no code from the cloud.

A package may carry a pipeline in its signed manifest (``metadata.pipeline``)::

    {"version": 1,
     "source":  {"type": "file", "path": "/var/log/app/events.jsonl"},  # or unix_socket, stdin, directory
     "parse":   {"format": "json"},            # or {"format": "csv", "fields": ["ts", "user", "kind"]}
     "time_field": "ts", "key_field": "user",
     "filters": [{"field": "kind", "op": "in", "value": ["click", "view", "buy"]}],
     "windows": [{"name": "w10", "type": "tumbling", "size": 10, "field": "value",
                  "aggregates": ["count", "sum", "mean", "min", "max"]},
                 {"name": "s30", "type": "sliding", "size": 30, "slide": 10, "field": "value",
                  "aggregates": ["count", "mean"]}],
     "triggers": [{"name": "browse_then_buy", "field": "kind", "sequence": ["view", "view", "buy"],
                   "within": 60}],
     "features": {"input": "features", "values": ["w10.count", "w10.mean", "s30.mean", "event.value"]},
     "batch":   {"size": 32, "max_wait_ms": 50},
     "postprocess": {"threshold": 0.5, "top_k": 2, "labels": ["no", "yes"]},
     "sinks": [{"type": "file", "path": "/var/lib/ferry-agent/results.jsonl"}, {"type": "telemetry"}]}

Events flow parse → filter → per-key windows → triggers; a trigger assembles the key's
features into one row of the model's input, rows are batched so small models are not
dominated by per-call overhead, and the post-processed results go to the sinks.

Triggers are many event sequences matched in one pass: the patterns share a trie, and each
key keeps the set of trie nodes its recent events reached (with the time each partial
match started, for ``within``).

Everything here is plain Python on lists and dicts; numpy is imported only to batch
inference.  bench/agent_stream.py measures the throughput.
"""

from __future__ import annotations

import csv
import gc
import json
import logging
import operator
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

AGGREGATES = ("count", "sum", "mean", "min", "max")
OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "source", "parse"],
    "properties": {
        "version": {"const": 1},
        "source": {
            "type": "object",
            "additionalProperties": False,
            "required": ["type"],
            "properties": {
                "type": {"enum": ["file", "unix_socket", "stdin", "directory"]},
                "path": {"type": "string", "minLength": 1},
                "from_start": {"type": "boolean"},
                "pattern": {"type": "string"},
            },
        },
        "parse": {
            "type": "object",
            "additionalProperties": False,
            "required": ["format"],
            "properties": {
                "format": {"enum": ["json", "csv"]},
                "fields": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "delimiter": {"type": "string", "minLength": 1, "maxLength": 1},
                "numeric": {"type": "array", "items": {"type": "string"}},
            },
        },
        "time_field": {"type": "string"},
        "key_field": {"type": "string"},
        "filters": {
            "type": "array",
            "maxItems": 32,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["field", "op", "value"],
                "properties": {"field": {"type": "string"}, "op": {"enum": list(OPS)}, "value": {}},
            },
        },
        "windows": {
            "type": "array",
            "maxItems": 16,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "type", "size", "field"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                    "type": {"enum": ["tumbling", "sliding"]},
                    "size": {"type": "number", "exclusiveMinimum": 0},
                    "slide": {"type": "number", "exclusiveMinimum": 0},
                    "field": {"type": "string"},
                    "aggregates": {"type": "array", "items": {"enum": list(AGGREGATES)}},
                },
            },
        },
        "triggers": {
            "type": "array",
            "maxItems": 1024,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "field", "sequence"],
                "properties": {
                    "name": {"type": "string"},
                    "field": {"type": "string"},
                    "sequence": {"type": "array", "minItems": 1, "maxItems": 64},
                    "within": {"type": "number", "exclusiveMinimum": 0},
                },
            },
        },
        "features": {
            "type": "object",
            "additionalProperties": False,
            "required": ["input", "values"],
            "properties": {
                "input": {"type": "string"},
                "values": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
        },
        "batch": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 4096},
                "max_wait_ms": {"type": "number", "minimum": 0},
            },
        },
        "postprocess": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "threshold": {"type": "number"},
                "top_k": {"type": "integer", "minimum": 1},
                "labels": {"type": "array", "items": {"type": "string"}},
            },
        },
        "sinks": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["type"],
                "properties": {"type": {"enum": ["file", "socket", "telemetry"]}, "path": {"type": "string"}},
            },
        },
    },
}


class PipelineError(ValueError):
    """The pipeline spec is invalid; the message names the offending part."""


def load_spec(spec: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """Parse (JSON or YAML file, or a dict) and validate against SCHEMA plus cross-references."""
    if not isinstance(spec, dict):
        text = Path(spec).read_text()
        if str(spec).endswith((".yaml", ".yml")):
            import yaml

            spec = yaml.safe_load(text)
        else:
            spec = json.loads(text)
    import jsonschema

    try:
        jsonschema.validate(spec, SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise PipelineError(f"pipeline spec invalid at {where}: {exc.message}") from None
    if spec["parse"]["format"] == "csv" and not spec["parse"].get("fields"):
        raise PipelineError("pipeline spec invalid at parse: csv needs 'fields'")
    if spec["source"]["type"] != "stdin" and not spec["source"].get("path"):
        raise PipelineError(
            f"pipeline spec invalid at source: a {spec['source']['type']} source needs 'path'"
        )
    windows = {w["name"]: w for w in spec.get("windows", [])}
    for w in windows.values():
        if w["type"] == "sliding" and ("slide" not in w or w["size"] % w["slide"]):
            raise PipelineError(f"window {w['name']}: a sliding window needs a 'slide' that divides its size")
    for value in spec.get("features", {}).get("values", []):
        source, _, name = value.partition(".")
        if source == "event":
            continue
        if source not in windows or name not in windows[source].get("aggregates", AGGREGATES):
            raise PipelineError(
                f"feature {value!r} names no window aggregate (windows: {', '.join(windows)})"
            )
    return spec


# --- parse and filter ------------------------------------------------------------------------


def make_parser(spec: dict[str, Any]) -> Callable[[list[str]], tuple[list[dict], int]]:
    """A function: lines -> (events, malformed line count). JSON lines are parsed a chunk at a time."""
    parse = spec["parse"]
    if parse["format"] == "json":

        def parse_json(lines: list[str]) -> tuple[list[dict], int]:
            try:  # one C-level call for the whole chunk: the common, well-formed case
                events = json.loads("[" + ",".join(lines) + "]")
                if all(type(e) is dict for e in events):
                    return events, 0
            except ValueError:
                pass
            events, bad = [], 0
            for line in lines:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if type(event) is dict:
                    events.append(event)
                else:
                    bad += 1
            return events, bad

        return parse_json
    fields, delimiter = parse["fields"], parse.get("delimiter", ",")
    numeric = set(parse.get("numeric", []))
    width = len(fields)
    converters = [(i, f) for i, f in enumerate(fields) if f in numeric]

    def parse_csv(lines: list[str]) -> tuple[list[dict], int]:
        events, bad = [], 0
        for parts in csv.reader(lines, delimiter=delimiter):
            if len(parts) != width:
                bad += 1 if parts else 0  # a blank line is not an error
                continue
            event = dict(zip(fields, parts, strict=True))
            try:
                for i, name in converters:
                    event[name] = float(parts[i])
            except ValueError:
                bad += 1
                continue
            events.append(event)
        return events, bad

    return parse_csv


_MISSING = object()


def make_filter(spec: dict[str, Any]) -> Callable[[list[dict]], list[dict]] | None:
    """A function: events -> the events every rule keeps (an event lacking the field is dropped)."""
    rules = [(f["field"], f["op"], f["value"]) for f in spec.get("filters", [])]
    if not rules:
        return None
    if len(rules) == 1 and rules[0][1] in ("eq", "ne", "in", "not_in"):
        # the common single-rule cases as plain comprehensions: no call per event
        name, op, value = rules[0]
        if op in ("in", "not_in"):
            value = frozenset(value) if all(isinstance(v, str | int | float) for v in value) else value
        if op == "eq":
            return lambda events: [e for e in events if e.get(name, _MISSING) == value]
        if op == "ne":
            return lambda events: [e for e in events if name in e and e[name] != value]
        if op == "in":
            return lambda events: [e for e in events if e.get(name, _MISSING) in value]
        return lambda events: [e for e in events if name in e and e[name] not in value]
    checks = [(name, OPS[op], value) for name, op, value in rules]

    def keep(event: dict) -> bool:
        try:
            return all(name in event and op(event[name], value) for name, op, value in checks)
        except TypeError:  # comparing a string with a number: the event does not match
            return False

    return lambda events: [e for e in events if keep(e)]


# --- windows ----------------------------------------------------------------------------------


@dataclass
class Window:
    """Per-key tumbling window (or the panes of a sliding one), by event time.

    The hot path only moves a closed window's raw state aside; aggregates are computed when a
    feature asks for them (far less often than events arrive).
    """

    name: str
    size: float
    field: str
    aggregates: tuple[str, ...]
    slide: float | None = None  # sliding: panes of this length, the last size/slide of them count
    open: dict[Any, list] = field(default_factory=dict)  # key -> [start, count, sum, min, max]
    closed: dict[Any, Any] = field(default_factory=dict)  # key -> last closed state (tumbling) or panes

    def __post_init__(self) -> None:
        self.pane = self.slide or self.size
        self.panes_kept = int(self.size // self.pane)

    def add(self, key: Any, ts: float, value: float) -> None:
        start = ts - ts % self.pane
        state = self.open.get(key)
        if state is None or state[0] != start:
            if state is not None:
                if self.slide is None:
                    self.closed[key] = state
                else:
                    panes = self.closed.get(key)
                    if panes is None:
                        panes = self.closed[key] = deque(maxlen=self.panes_kept)
                    panes.append(state)
            self.open[key] = [start, 1, value, value, value]
            return
        state[1] += 1
        state[2] += value
        if value < state[3]:
            state[3] = value
        elif value > state[4]:
            state[4] = value

    def current(self, key: Any) -> dict[str, float]:
        """The latest closed window's aggregates (the open one's so far when none closed yet)."""
        closed = self.closed.get(key)
        if closed is None:
            state = self.open.get(key)
            return (
                _aggregate(state[1], state[2], state[3], state[4]) if state else _aggregate(0, 0.0, 0.0, 0.0)
            )
        if self.slide is None:
            return _aggregate(closed[1], closed[2], closed[3], closed[4])
        cutoff = closed[-1][0] + self.pane - self.size
        live = [p for p in closed if p[0] >= cutoff]
        return _aggregate(
            sum(p[1] for p in live), sum(p[2] for p in live), min(p[3] for p in live), max(p[4] for p in live)
        )


def _aggregate(count: int, total: float, low: float, high: float) -> dict[str, float]:
    return {"count": count, "sum": total, "mean": total / count if count else 0.0, "min": low, "max": high}


# --- triggers: many sequences, one trie, one pass ------------------------------------------------


class TriggerTrie:
    """Every trigger pattern is a path in one trie; matching runs them all in one pass.

    A pattern matches consecutive events of one key.  A key's state is the set of trie nodes
    its recent events reached; those sets are interned and their transitions memoised (the
    Aho-Corasick automaton, built lazily), so one event costs one dictionary lookup however
    many patterns there are.  ``within`` is checked on completion against the timestamp of
    the pattern's first event, from a short per-key history.
    """

    def __init__(self, triggers: list[dict[str, Any]]) -> None:
        self.children: list[dict[Any, int]] = [{}]
        self.fires: list[list[tuple[str, float | None, int]]] = [[]]
        fields = sorted({t["field"] for t in triggers})
        if len(fields) > 1:
            raise PipelineError(f"triggers must all match one field, not {', '.join(fields)}")
        self.field = fields[0] if fields else ""
        self.order: dict[str, int] = {}
        for index, trigger in enumerate(triggers):
            self.order.setdefault(trigger["name"], index)
            node = 0
            for symbol in trigger["sequence"]:
                nxt = self.children[node].get(symbol)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][symbol] = nxt
                    self.children.append({})
                    self.fires.append([])
                node = nxt
            self.fires[node].append((trigger["name"], trigger.get("within"), len(trigger["sequence"])))
        self.history = max((len(t["sequence"]) for t in triggers if t.get("within")), default=0)
        self._ids: dict[frozenset, int] = {frozenset(): 0}
        self._sets: list[frozenset] = [frozenset()]
        self._moves: list[dict[Any, tuple[int, tuple]]] = [{}]  # state -> symbol -> (next, completions)
        self.keys: dict[Any, int] = {}  # key -> automaton state
        self.times: dict[Any, deque] = {}  # key -> recent timestamps (only for `within`)

    def _move(self, state: int, symbol: Any) -> tuple[int, tuple]:
        children = self.children
        reached = {children[n][symbol] for n in self._sets[state] if symbol in children[n]}
        if symbol in children[0]:
            reached.add(children[0][symbol])
        # completions in the order the triggers are declared, whatever their trie nodes
        fired = tuple(sorted((f for n in reached for f in self.fires[n]), key=lambda f: self.order[f[0]]))
        alive = frozenset(n for n in reached if children[n])
        nxt = self._ids.get(alive)
        if nxt is None:
            nxt = self._ids[alive] = len(self._sets)
            self._sets.append(alive)
            self._moves.append({})
        self._moves[state][symbol] = (nxt, fired)
        return nxt, fired

    def step(self, key: Any, symbol: Any, ts: float) -> list[str]:
        """Advance the key by one event; return the names of the triggers it completed."""
        state = self.keys.get(key, 0)
        move = self._moves[state].get(symbol)
        if move is None:
            move = self._move(state, symbol)
        self.keys[key] = move[0]
        if self.history:
            times = self.times.get(key)
            if times is None:
                times = self.times[key] = deque(maxlen=self.history)
            times.append(ts)
        if not move[1]:
            return []
        fired = []
        for name, within, length in move[1]:
            if within is None or ts - self.times[key][-length] <= within:
                fired.append(name)
        return fired


# --- the pipeline ---------------------------------------------------------------------------------


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
    ) -> None:
        self.spec = load_spec(spec)
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
                buffer = []
            if not line and self._rows and time.monotonic() - self._first_row_at >= self.max_wait:
                self.flush()
            if stop is not None and stop.is_set():
                break
        if buffer:
            self.feed(buffer)
        self.flush()
        return self.stats


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


# --- sources and sinks --------------------------------------------------------------------------


def source_lines(
    source: dict[str, Any],
    stop: threading.Event,
    poll: float = 0.2,
    ready: threading.Event | None = None,
) -> Iterator[str]:
    """Lines from a tailed file, a UNIX socket (one client at a time), stdin or a watched directory.

    Live sources yield "" whenever they are idle for a poll period (see Pipeline.run).

    ``ready`` is set once the source takes input: from then on, whatever is appended to the
    file, sent to the socket or dropped into the directory is read.  A socket source is
    listening before its path appears, so a producer may also wait for the path."""
    ready = ready if ready is not None else threading.Event()
    kind = source["type"]
    if kind == "stdin":
        ready.set()
        yield from sys.stdin
    elif kind == "file":
        yield from _tail(Path(source["path"]), stop, poll, source.get("from_start", False), ready)
    elif kind == "directory":
        yield from _watch_directory(Path(source["path"]), source.get("pattern", "*"), stop, poll, ready)
    elif kind == "unix_socket":
        yield from _unix_socket(source["path"], stop, ready)


def _tail(
    path: Path, stop: threading.Event, poll: float, from_start: bool, ready: threading.Event
) -> Iterator[str]:
    try:
        f = open(path)  # noqa: SIM115 - reopened on rotation
        if not from_start:
            f.seek(0, os.SEEK_END)
    except FileNotFoundError:
        # Every byte of a file created after the source started is new: read it from its start
        # (seeking to its end would drop what the producer wrote before the next poll).
        ready.set()
        while not stop.is_set():
            try:
                f = open(path)  # noqa: SIM115
                break
            except FileNotFoundError:
                stop.wait(poll)
        else:
            return
    ready.set()  # the file is open and positioned: every line appended from now on is read
    inode = os.fstat(f.fileno()).st_ino
    partial = ""
    try:
        while not stop.is_set():
            line = f.readline()
            if line:
                if line.endswith("\n"):
                    yield partial + line
                    partial = ""
                else:
                    partial += line
                continue
            try:
                if os.stat(path).st_ino != inode:  # rotated: follow the new file from its start
                    f.close()
                    f = open(path)  # noqa: SIM115
                    inode = os.fstat(f.fileno()).st_ino
                    continue
            except FileNotFoundError:
                pass
            yield ""
            stop.wait(poll)
    finally:
        f.close()


def _watch_directory(
    directory: Path, pattern: str, stop: threading.Event, poll: float, ready: threading.Event
) -> Iterator[str]:
    seen: set[str] = set()
    ready.set()  # the first scan has not run yet: every file present or dropped later is read
    while not stop.is_set():
        for path in sorted(directory.glob(pattern)):
            if path.name in seen or not path.is_file() or path.name.startswith("."):
                continue
            seen.add(path.name)
            with open(path) as f:
                yield from f
        yield ""
        stop.wait(poll)


# sockaddr_un's path holds 108 bytes with the terminating NUL on Linux
_UNIX_PATH_MAX = 107


def listen_unix(path: str) -> socket.socket:
    """A UNIX stream socket listening at ``path``, which appears only once it listens.

    bind() creates the path and listen() comes after it: a producer that connects as soon as
    the path exists would be refused in between.  So bind and listen under a hidden name in
    the same directory, then rename it onto ``path`` (atomic, and the socket follows its inode).
    """
    directory, name = os.path.split(path)
    hidden = os.path.join(directory, f".{name}.{os.getpid()}-{threading.get_ident() % 10**6}")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(os.fsencode(hidden)) > _UNIX_PATH_MAX:
            # no room for the hidden name: bind in place; `ready` still tells when it listens
            Path(path).unlink(missing_ok=True)
            server.bind(path)
            server.listen(1)
            return server
        Path(hidden).unlink(missing_ok=True)
        server.bind(hidden)
        server.listen(1)
        os.replace(hidden, path)  # also replaces a stale socket a previous run left behind
    except BaseException:
        server.close()
        Path(hidden).unlink(missing_ok=True)
        raise
    return server


def _unix_socket(path: str, stop: threading.Event, ready: threading.Event) -> Iterator[str]:
    server = listen_unix(path)
    inode = os.stat(path).st_ino
    server.settimeout(0.5)
    ready.set()
    try:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                yield ""
                continue
            conn.settimeout(0.5)
            with conn:
                pending = b""
                while not stop.is_set():
                    try:
                        data = conn.recv(65536)
                    except TimeoutError:
                        yield ""
                        continue
                    if not data:
                        break
                    *complete, pending = (pending + data).split(b"\n")
                    for raw in complete:
                        yield raw.decode("utf-8", "replace") + "\n"
    finally:
        server.close()
        _remove_own_socket(path, inode)


def _remove_own_socket(path: str, inode: int) -> None:
    """Remove the path once nobody listens there, unless another source has replaced it since."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass


def file_sink(path: str) -> Callable[[dict], None]:
    out = open(path, "a")  # noqa: SIM115 - lives as long as the pipeline

    def write(result: dict) -> None:
        out.write(json.dumps(result, sort_keys=True) + "\n")
        out.flush()

    return write


def socket_sink(path: str) -> Callable[[dict], None]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def send(result: dict) -> None:
        try:
            sock.sendto(json.dumps(result).encode(), path)
        except OSError as exc:  # nobody listening: results are not worth blocking the stream for
            log.debug("socket sink %s: %s", path, exc)

    return send
