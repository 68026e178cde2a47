"""Start the demo N times from a fresh data directory, optionally with both cores kept busy, and
print how many starts reached three live agents and how long each took.

    .venv/bin/python bench/demo_starts.py --runs 20 --load

Each start is what `make demo` runs on a fresh machine (embedded SQLite database and broker,
local files): migrate, start web, gateway, worker and beat, upload and convert the demo model,
release it, start three agents. A start counts once the demo's own summary shows three devices
running the release; the demo is then stopped with Ctrl-C (SIGINT) and must exit by itself.
`--load` runs one busy process per core beside it (like `stress --cpu 2`), as on a busy machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED_UNSET = ("FERRY_DATABASE_URL", "REDIS_URL", "FERRY_S3_BUCKET", "FERRY_S3_ENDPOINT_URL")
THREE_LIVE = re.compile(r":v1\s*│\s*3\s*│")


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def _start_once(data_dir: Path, timeout: float) -> tuple[float | None, float, str]:
    """(seconds to three live agents or None, seconds to stop after Ctrl-C, the output's tail)."""
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_UNSET}
    env["FERRY_DATA_DIR"] = str(data_dir)
    args = [sys.executable, "manage.py", "demo", "--no-live", "--http-port", "0", "--gateway-port", "0"]
    started = time.monotonic()
    demo = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    live = threading.Event()

    def read() -> None:
        for line in demo.stdout:
            lines.append(line)
            if THREE_LIVE.search(line):
                live.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reached = live.wait(timeout)
    took = time.monotonic() - started
    stopping = time.monotonic()
    demo.send_signal(signal.SIGINT)
    try:
        demo.wait(timeout=30)
    except subprocess.TimeoutExpired:
        demo.kill()
        demo.wait()
    reader.join(timeout=5)
    return (took if reached else None), time.monotonic() - stopping, "".join(lines[-15:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load", action="store_true", help="keep every core busy meanwhile")
    parser.add_argument("--timeout", type=float, default=240, help="seconds a start may take")
    args = parser.parse_args()

    spinners = []
    if args.load:
        stop_at = time.monotonic() + args.runs * (args.timeout + 40)
        spinners = [
            multiprocessing.Process(target=_spin, args=(stop_at,)) for _ in range(os.cpu_count() or 2)
        ]
        for spinner in spinners:
            spinner.start()
    times, stops, failures = [], [], 0
    try:
        for run in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="ferry-demo-") as data_dir:
                took, stop, tail = _start_once(Path(data_dir), args.timeout)
            stops.append(stop)
            if took is None:
                failures += 1
                print(f"run {run:2d}: FAILED to reach three live agents in {args.timeout:.0f} s\n{tail}")
            else:
                times.append(took)
                print(f"run {run:2d}: three agents live after {took:5.1f} s; stopped in {stop:4.1f} s")
    finally:
        for spinner in spinners:
            spinner.terminate()
    print(
        f"demo starts{' under load' if args.load else ''}: {len(times)} of {args.runs} reached three live "
        f"agents; time to live median {statistics.median(times) if times else float('nan'):.1f} s, "
        f"max {max(times, default=float('nan')):.1f} s; stop after Ctrl-C max {max(stops):.1f} s"
    )


if __name__ == "__main__":
    main()
