"""Parse and filter: raw lines to event dicts a chunk at a time, and the filter rules."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from typing import Any

from agent.stream.spec import OPS


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
