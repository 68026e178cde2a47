"""What the agent process costs the device: CPU, resident memory, free disk (no psutil needed)."""

from __future__ import annotations

import os
import resource
import shutil
import time
from pathlib import Path


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class ProcessMeter:
    """CPU use of this process between two readings, as a percentage of one core."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._last = (time.monotonic(), _cpu_seconds())

    def read(self) -> dict[str, float | int]:
        now, cpu = time.monotonic(), _cpu_seconds()
        then, cpu_then = self._last
        self._last = (now, cpu)
        elapsed = max(now - then, 1e-6)
        return {
            "cpu_percent": round(100.0 * (cpu - cpu_then) / elapsed, 3),
            "cpu_seconds_total": round(cpu, 3),
            "rss_bytes": rss_bytes(),
            "disk_free_bytes": shutil.disk_usage(self.state_dir).free,
        }


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system
