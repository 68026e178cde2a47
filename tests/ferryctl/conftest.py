"""ferryctl runs as a real process against a live server (Django's live_server on the test
database); conversions run on a real Celery worker process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

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
def conversion_worker(live_server, tmp_path):
    """A real Celery worker process on the test database and the suite's broker: conversions
    the live server queues run there, as in production."""
    database = connection.settings_dict
    url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
    if database["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{database['NAME']}"
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below, after the process
    paths = os.pathsep.join([str(ROOT), str(ROOT / "platform")])
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ferry_cloud", "worker", "--pool", "solo", "-l", "INFO"],
        env={**os.environ, "FERRY_DATABASE_URL": url, "PYTHONPATH": paths},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in (tmp_path / "worker.log").read_text():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Celery worker did not start within 60 s"
            time.sleep(0.2)
        yield worker
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
