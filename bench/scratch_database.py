"""A scratch PostgreSQL database for a benchmark run, beside the one FERRY_DATABASE_URL names,
so a bench never writes to a database someone uses; dropped afterwards whatever happens."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse, urlunparse


def _admin_url(url: str) -> str:
    return urlunparse(urlparse(url)._replace(path="/postgres"))


@contextmanager
def scratch_database(url: str, purpose: str) -> Iterator[str]:
    """The URL of a new, empty database named ``<db>_bench_<purpose>``; Django's connections to it
    are closed and it is dropped (FORCE: a killed child may still hold one) when the block ends."""
    import psycopg

    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        sys.exit("FERRY_DATABASE_URL must name a PostgreSQL database")
    name = f"{parsed.path.lstrip('/') or 'ferry'}_bench_{purpose}"
    with psycopg.connect(_admin_url(url), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunparse(parsed._replace(path=f"/{name}"))
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(_admin_url(url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
