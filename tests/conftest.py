"""Suite-wide fixtures: the real services the control plane talks to.

PostgreSQL and Redis must be running on loopback (see the README); the S3 server is
moto in server mode, started here on the port FERRY_S3_ENDPOINT_URL names.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import pytest
from hypothesis import settings as hypothesis_settings

# CI draws the same examples on every run (seeded from each test's name), so a red run is the
# change's doing and can be replayed; runs elsewhere keep exploring new examples.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# Serving defaults to the LLM kernels compiled ahead of time (engine/llm/aot.py) once activation
# has built them; tests pick their tier explicitly (numba's JIT unless a test says otherwise:
# tests/engine/llm/test_aot.py, and serve-llm in tests/agent/llm/test_serve_llm.py), so which
# kernels a test runs never depends on whether an earlier test built the extension.
os.environ.setdefault("FERRY_LLM_AOT", "0")


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


DEFAULT_PORTS = {"postgres": 5432, "redis": 6379}


def _require(url_var: str, what: str) -> None:
    """Stop the run with an actionable message when a service the settings name is down."""
    url = urlparse(os.environ.get(url_var, ""))
    port = url.port or DEFAULT_PORTS.get(url.scheme)
    if url.hostname and port and not _listening(url.hostname, port):
        pytest.exit(
            f"{what} is not reachable at {url.hostname}:{port} ({url_var}). Start it (README: "
            f"'Testing'), or point {url_var} elsewhere.",
            returncode=3,
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    _require("FERRY_DATABASE_URL", "PostgreSQL")
    _require("REDIS_URL", "Redis")


@pytest.fixture(scope="session", autouse=True)
def s3_server():
    """A real S3-compatible server (moto) for the storage backend, with the test bucket created."""
    endpoint = os.environ.get("FERRY_S3_ENDPOINT_URL")
    if not os.environ.get("FERRY_S3_BUCKET") or not endpoint:
        yield None
        return
    url = urlparse(endpoint)
    process = None
    if not _listening(url.hostname, url.port):
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", url.hostname, "-p", str(url.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not _listening(url.hostname, url.port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.exit(f"could not start the S3 server (moto) on {url.netloc}", returncode=3)
            time.sleep(0.1)
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if os.environ["FERRY_S3_BUCKET"] not in existing:
        s3.create_bucket(Bucket=os.environ["FERRY_S3_BUCKET"])
    yield endpoint
    if process is not None:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker, request):
    """pytest-django's test database, and at the end a check that nothing still holds it open:
    a connection left by a thread makes DROP DATABASE fail ("being accessed by other users")
    after every test passed. Such connections are reported with their last query and ended."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, left(query, 200) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        strays = cursor.fetchall()
        for pid, *_ in strays:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    if strays:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(f"connections to the test database left open (ended): {strays}", yellow=True)
