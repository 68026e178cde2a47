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

One module per idea: ``spec`` (schema, validation), ``parsing`` (lines to events, filters),
``windows``, ``triggers``, ``pipeline`` (the hot loop, batching, post-processing),
``sources`` and ``sinks``, ``recent`` (the durable ring of recent events a health check
replays); the public names are re-exported here.
"""

from agent.stream.parsing import make_filter, make_parser
from agent.stream.pipeline import Pipeline, Stats, engine_infer, postprocess
from agent.stream.recent import EventRing
from agent.stream.sinks import file_sink, socket_sink
from agent.stream.sources import listen_unix, source_lines
from agent.stream.spec import AGGREGATES, OPS, SCHEMA, PipelineError, load_spec
from agent.stream.triggers import TriggerTrie
from agent.stream.windows import Window

__all__ = [
    "AGGREGATES",
    "EventRing",
    "OPS",
    "SCHEMA",
    "Pipeline",
    "PipelineError",
    "Stats",
    "TriggerTrie",
    "Window",
    "engine_infer",
    "file_sink",
    "listen_unix",
    "load_spec",
    "make_filter",
    "make_parser",
    "postprocess",
    "socket_sink",
    "source_lines",
]
