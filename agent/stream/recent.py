"""A small durable ring of the last real events a pipeline read, for the next health check.

A new version's self-test feeds the package's own sample, which always fits its model; the
events a device really receives may not.  So the running pipeline keeps its last few raw
lines (bounded in count and bytes), written now and then as one JSON file under the agent's
state directory (atomically: a crash leaves the old ring or the new one), and the health
check replays them through the new version's pipeline (agent/install.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from pathlib import Path

from agent.files import write_atomic

log = logging.getLogger(__name__)

RING_FILE = "recent-events.json"
MAX_EVENTS = 256
MAX_BYTES = 64 << 10  # the whole ring
MAX_LINE_BYTES = 4 << 10  # a longer line is not kept (it would crowd out the others)
SAVE_EVERY_SECONDS = 5.0


def ring_path(state_dir: Path) -> Path:
    return Path(state_dir) / RING_FILE


def state_dir_of(version_dir: Path) -> Path | None:
    """The agent's state directory, for a version unpacked at <state>/versions/<id> (or the
    <state>/current link to it)."""
    version_dir = Path(version_dir).resolve()
    return version_dir.parent.parent if version_dir.parent.name == "versions" else None


class EventRing:
    """The last ``max_events`` lines (at most ``max_bytes`` of them), saved to ``path``."""

    def __init__(
        self,
        path: Path,
        *,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
        save_every: float = SAVE_EVERY_SECONDS,
    ) -> None:
        self.path = Path(path)
        self.max_events, self.max_bytes, self.save_every = max_events, max_bytes, save_every
        self._lines: deque[str] = deque()
        self._bytes = 0
        self._saved_at = 0.0
        self._dirty = False
        for line in load(self.path):
            self._append(line)

    def __len__(self) -> int:
        return len(self._lines)

    def lines(self) -> list[str]:
        return list(self._lines)

    def _append(self, line: str) -> None:
        size = len(line.encode())
        if not line or size > MAX_LINE_BYTES or size > self.max_bytes:
            return
        self._lines.append(line)
        self._bytes += size
        while len(self._lines) > self.max_events or self._bytes > self.max_bytes:
            self._bytes -= len(self._lines.popleft().encode())

    def extend(self, lines: list[str]) -> None:
        """Keep the newest of these lines (only the last max_events of them can survive)."""
        for line in lines[-self.max_events :]:
            self._append(line.rstrip("\n"))
        self._dirty = True
        self.save_if_due()

    def save_if_due(self) -> None:
        """Save unsaved lines once save_every has passed since the last save (the pipeline calls
        this when its source is idle too, so the last events before a quiet spell are kept)."""
        if self._dirty and time.monotonic() - self._saved_at >= self.save_every:
            self.save()

    def save(self) -> None:
        """Write the ring now (atomically); a failure is logged, the pipeline goes on."""
        if not self._dirty:
            return
        try:
            write_atomic(
                self.path, json.dumps({"version": 1, "lines": list(self._lines)}).encode(), mode=0o600
            )
        except OSError as exc:
            log.warning("could not save the recent events to %s: %s", self.path, exc)
        self._saved_at = time.monotonic()
        self._dirty = False


def load(path: Path) -> list[str]:
    """The saved lines; [] when there is no ring yet or it is unreadable (it is only a sample)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("ignoring the unreadable recent events %s: %s", path, exc)
        return []
    lines = data.get("lines") if isinstance(data, dict) else None
    if not isinstance(lines, list):
        return []
    return [line for line in lines if isinstance(line, str)]
