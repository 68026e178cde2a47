"""The smallest valid pipeline spec, and variations of it."""

from __future__ import annotations

BASE = {"version": 1, "source": {"type": "stdin"}, "parse": {"format": "json"}, "key_field": "user"}


def spec(**parts) -> dict:
    return {**BASE, **parts}
