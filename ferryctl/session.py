"""What every command shares: the connection and the common options."""

from __future__ import annotations

from typing import Annotated

import typer

from ferryctl.client import Ferry
from ferryctl.config import config_load

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of a table.")]
LimitOption = Annotated[
    int | None, typer.Option("--limit", min=1, help="At most this many rows (default: every page).")
]


def connect() -> Ferry:
    """The server from FERRY_URL/FERRY_TOKEN or the config file (ConfigError if neither)."""
    return Ferry(config_load())


def parse_pairs(pairs: list[str] | None, what: str) -> dict[str, str]:
    """key=value options (--labels site=lab) as a dict; a malformed one is a usage error."""
    found: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r} is not key=value", param_hint=what)
        found[key.strip()] = value.strip()
    return found
