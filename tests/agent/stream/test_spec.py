"""The pipeline spec: schema errors say where, files load as JSON or YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.stream import PipelineError, load_spec
from tests.agent.stream.specs import BASE, spec


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
