"""What this device refused, in ``refused.json`` (written atomically), so that an offer seen
again at every check-in is neither fetched again nor reported again.

A package refusal is keyed by the package's digest and size and the assignment's counter: a
wrong size is the offer's fault, not the package's, and a new assignment of a refused package
(a re-release) is a new instruction, tried again. A refusal may carry a time after which it is
retried (a full disk); one without is for good. A refused assignment (forged, replayed,
expired) is keyed by its bytes' sha256 and is never retried.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent.files import read_json, write_json_atomic
from agent.install import Offer


def refusal_key(offer: Offer) -> str:
    return f"{offer.package_digest}:{offer.package_size}:{offer.counter}"


class Refusals:
    def __init__(self, state_dir: Path) -> None:
        self.file = state_dir / "refused.json"

    def all(self) -> dict[str, dict[str, Any]]:
        return read_json(self.file, {}) or {}

    def blocks(self, offer: Offer) -> bool:
        """The offer was refused and is not due to be tried again."""
        entry = self.all().get(refusal_key(offer))
        if entry is None:
            return False
        retry_at = entry.get("retry_at")
        return retry_at is None or time.time() < retry_at

    def for_good(self, offer: Offer) -> bool:
        """The offer was refused and will never be tried again."""
        entry = self.all().get(refusal_key(offer))
        return entry is not None and entry.get("retry_at") is None

    def remember(self, offer: Offer, reason: str, retry_after: float | None) -> None:
        now = time.time()
        self._add(
            refusal_key(offer),
            {
                "version_id": offer.version_id,
                "reason": reason,
                "at": now,
                "retry_at": None if retry_after is None else now + retry_after,
            },
        )

    def remember_assignment(self, sha256: str, reason: str) -> bool:
        """Record a refused assignment; False if it was refused before (report it once)."""
        key = f"assignment:{sha256}"
        if key in self.all():
            return False
        self._add(key, {"version_id": "", "reason": reason, "at": time.time(), "retry_at": None})
        return True

    def _add(self, key: str, entry: dict[str, Any]) -> None:
        refused = self.all()
        refused[key] = entry
        write_json_atomic(self.file, refused)
