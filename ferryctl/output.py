"""What ferryctl prints: rich tables for people, JSON (--json) for scripts, messages on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

Column = tuple[str, Callable[[dict], Any]]  # a heading, and how a row gives its cell


def field(name: str) -> Callable[[dict], Any]:
    return lambda row: row.get(name)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_inner(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _inner(value: Any) -> str:
    """A value inside a dict cell: nested structures as compact JSON."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def table(rows: Sequence[dict], columns: Sequence[Column], title: str | None = None) -> Table:
    shown = Table(title=title, title_justify="left")
    for heading, _ in columns:
        shown.add_column(heading, overflow="fold")
    for row in rows:
        shown.add_row(*(cell(get(row)) for _, get in columns))
    return shown


def show_rows(rows: Sequence[dict], columns: Sequence[Column], as_json: bool) -> None:
    if as_json:
        emit_json(list(rows))
    else:
        out.print(table(rows, columns))


def show_record(record: dict, columns: Sequence[Column], as_json: bool) -> None:
    """One resource: a two-column table of the chosen fields, or its whole JSON."""
    if as_json:
        emit_json(record)
        return
    shown = Table(show_header=False)
    shown.add_column(style="bold")
    shown.add_column(overflow="fold")
    for heading, get in columns:
        shown.add_row(heading, cell(get(record)))
    out.print(shown)
