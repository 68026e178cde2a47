"""What the end-to-end tests share: a PostgreSQL database of a test's own, and waiting on a
condition while the stack's processes stay alive."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from ferry_cloud.stack import Stack


@contextmanager
def own_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database beside the suite's; dropped afterwards even
    if a process of the test still holds a connection to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    base_url = os.environ["FERRY_DATABASE_URL"].rsplit("/", 1)[0]
    with psycopg.connect(base_url + "/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base_url}/{name}"
    finally:
        with psycopg.connect(base_url + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def wait_until(what: str, check: Callable[[], object], stack: Stack, timeout: float = 40.0):
    """check()'s first truthy result, polled every 0.5 s; fails naming ``what`` (and the logs)
    after ``timeout``, or at once when one of the stack's processes has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; logs in {stack.log_dir}")


def enrolment_bundle_for(token: str, port: int, enrol_port: int) -> str:
    """The bundle an agent enrols with at a gateway this test serves in-process on loopback
    (build_server(f"127.0.0.1:{port}", enrol_address=f"127.0.0.1:{enrol_port}"))."""
    from fleet.services import enrolment_bundle

    return enrolment_bundle(
        token=token, gateway_address=f"127.0.0.1:{port}", enrol_address=f"127.0.0.1:{enrol_port}"
    )
