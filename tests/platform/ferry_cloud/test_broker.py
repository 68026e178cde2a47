"""The embedded broker under concurrent start-up: many processes creating its tables and queue
rows at once, and a real Celery worker and beat started together against a fresh broker."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROCESSES = 6
ROUNDS = 4


def _publish_at_once(url: str, queue: str, barrier, results) -> None:
    """One process: wait for the others, then declare the queue and publish to it."""
    from ferry_cloud.broker import register_transport
    from kombu import Connection

    register_transport()
    try:
        barrier.wait(timeout=30)  # all at once: tables, queue row and message
        with Connection(url) as connection:
            simple = connection.SimpleQueue(queue)
            simple.put({"from": os.getpid()})
            simple.close()
        results.put("ok")
    except Exception as exc:  # the parent asserts on what each child reports
        results.put(f"{type(exc).__name__}: {exc}")


def _race(url: str, queue: str) -> list[str]:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    children = [
        context.Process(target=_publish_at_once, args=(url, queue, barrier, results))
        for _ in range(PROCESSES)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
    return [results.get(timeout=5) for _ in children]


def test_processes_creating_the_same_queue_at_once_all_succeed(tmp_path: Path):
    from ferry_cloud.broker import register_transport
    from kombu import Connection

    register_transport()
    for round_ in range(ROUNDS):
        url = f"ferrysqla+sqlite:///{tmp_path / f'broker-{round_}.sqlite3'}"  # fresh: tables race too
        assert _race(url, "celery") == ["ok"] * PROCESSES
        with Connection(url) as connection:
            simple = connection.SimpleQueue("celery")
            assert simple.qsize() == PROCESSES  # every publish was stored, once
            simple.close()


def _celery(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "ferry_cloud", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def migrated_sqlite(tmp_path_factory) -> Path:
    """A migrated SQLite database to copy: the worker's tasks read the job tables."""
    data = tmp_path_factory.mktemp("template")
    env = {
        **os.environ,
        "FERRY_DATA_DIR": str(data),
        "FERRY_DATABASE_URL": f"sqlite:///{data / 'db.sqlite3'}",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120
    )
    return data / "db.sqlite3"


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(2))
def test_worker_and_beat_start_together_on_a_fresh_embedded_broker(migrated_sqlite, tmp_path: Path, attempt):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(migrated_sqlite, data / "db.sqlite3")
    env = {
        **os.environ,
        "FERRY_DATA_DIR": str(data),
        "FERRY_DATABASE_URL": f"sqlite:///{data / 'db.sqlite3'}",
        "REDIS_URL": "",  # the embedded broker, created by whichever process comes first
        "FERRY_REQUEUE_INTERVAL_SECONDS": "1",
        "FERRY_LOG_FORMAT": "console",
    }
    worker = _celery(["worker", "--pool", "solo", "--loglevel", "INFO"], env, tmp_path / "worker.log")
    beat = _celery(["beat", "--loglevel", "INFO"], env, tmp_path / "beat.log")
    try:
        deadline = time.monotonic() + 90
        done = "registry.tasks.requeue_stale_conversions"
        while time.monotonic() < deadline:
            for name, process in (("worker", worker), ("beat", beat)):
                assert process.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
            log = (tmp_path / "worker.log").read_text(errors="replace")
            if any(done in line and ("succeeded" in line or "SUCCESS" in line) for line in log.splitlines()):
                break
            time.sleep(0.3)
        else:
            raise AssertionError("beat's task never ran on the worker:\n" + log[-3000:])
        for name in ("worker", "beat"):
            text = (tmp_path / f"{name}.log").read_text(errors="replace")
            assert "IntegrityError" not in text and "Traceback" not in text, text[-3000:]
    finally:
        for process in (beat, worker):
            process.terminate()
        for process in (beat, worker):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
