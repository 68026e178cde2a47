"""The pipeline spec: its JSON schema, the cross-checks the schema cannot express, and the error."""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
