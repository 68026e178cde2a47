"""ferryctl runs as a real process against a live server (Django's live_server on the test
database); conversions run on the test's own worker thread, as a Celery worker would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection
from registry import tasks
from registry.services import conversion_run

from tests.platform.conftest import admin, org  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def ferryctl(live_server, admin, tmp_path):  # noqa: F811
    """ferryctl(*args, token=..., env=...) -> Run: the CLI as a subprocess, configured by
    FERRY_URL/FERRY_TOKEN, with a config directory of its own."""

    def run(*args: str, token: str | None = None, env: dict | None = None, timeout: float = 120) -> Run:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "FERRY_URL": live_server.url,
            "FERRY_TOKEN": admin[1] if token is None else token,
            "COLUMNS": "200",
            **(env or {}),
        }
        done = subprocess.run(
            [sys.executable, "-m", "ferryctl", *args],
            env={k: v for k, v in environment.items() if v is not None},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Run(done.returncode, done.stdout, done.stderr)

    return run


@pytest.fixture
def conversion_worker(monkeypatch):
    """Conversions queued by the live server run on a thread here, a moment later (so a client
    that waits sees them converting first); the real conversion service does the work."""
    threads: list[threading.Thread] = []

    def convert(job_id: int) -> None:
        def work() -> None:
            try:
                threading.Event().wait(1.0)
                conversion_run(job_id=job_id, worker="test-worker")
            finally:
                connection.close()

        thread = threading.Thread(target=work, daemon=True)
        threads.append(thread)
        thread.start()

    monkeypatch.setattr(tasks.convert_version, "delay", convert)
    yield
    for thread in threads:
        thread.join(timeout=120)
