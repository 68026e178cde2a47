"""Stopping `manage.py demo` (what `make demo` runs): Ctrl-C stops web, gateway, worker, beat and
the three agents within 10 s, and a SIGKILLed demo leaves no child behind either."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_UNSET = ("FERRY_DATABASE_URL", "REDIS_URL", "FERRY_S3_BUCKET", "FERRY_S3_ENDPOINT_URL")
STOP_SECONDS = 10
CHILDREN = 7  # web, gateway, worker, beat and three agents

pytestmark = pytest.mark.slow


class Demo:
    """The demo as a user runs it, its output collected line by line."""

    def __init__(self, data_dir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_UNSET}
        env["FERRY_DATA_DIR"] = str(data_dir)
        args = ["manage.py", "demo", "--no-live", "--http-port", "0", "--gateway-port", "0"]
        self.process = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_running(self, timeout: float = 240) -> list[psutil.Process]:
        """Wait for the demo to print its console line; returns its children."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "".join(self.lines)[-3000:]
            if any("Ctrl-C stops everything" in line for line in self.lines):
                children = psutil.Process(self.process.pid).children(recursive=True)
                assert len(children) >= CHILDREN, [c.cmdline()[:4] for c in children]
                return children
            time.sleep(0.2)
        raise AssertionError("the demo did not start:\n" + "".join(self.lines)[-3000:])


def _survivors(children: list[psutil.Process], timeout: float) -> list[list[str]]:
    _, alive = psutil.wait_procs(children, timeout=timeout)
    return [p.cmdline()[:5] for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_stops_every_child_and_a_killed_demo_leaves_none(tmp_path: Path):
    demo = Demo(tmp_path)
    children = demo.wait_running()
    started = time.monotonic()
    demo.process.send_signal(signal.SIGINT)
    assert demo.process.wait(timeout=STOP_SECONDS + 5) == 0, "".join(demo.lines)[-3000:]
    assert time.monotonic() - started <= STOP_SECONDS + 2
    assert _survivors(children, timeout=1) == []

    demo = Demo(tmp_path)  # same data dir: it picks up where it was
    children = demo.wait_running()
    try:
        demo.process.kill()  # no handler runs: the children must notice on their own
        demo.process.wait()
        assert _survivors(children, timeout=STOP_SECONDS) == []
    finally:
        for child in children:
            if child.is_running():
                child.kill()
