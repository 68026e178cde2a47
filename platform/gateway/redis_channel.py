"""The gateway's Redis: its URL, one client per URL for the process, and the hint channel.

Shared by the hint hub (publishes and listens), its listener and the fleet-generation cache,
so none of them imports another for it. The clients are a process-wide cache keyed by URL:
redis-py's clients are thread-safe and reconnect by themselves, so an entry is never
invalidated.
"""

from __future__ import annotations

import os
from typing import Any

CHANNEL = "ferry:fleet-changed"

_clients: dict[str, Any] = {}


def redis_url() -> str:
    """REDIS_URL, or "" when the process runs without Redis (the embedded profile)."""
    return os.environ.get("REDIS_URL", "")


def redis_client(url: str) -> Any:
    """The process's synchronous client for ``url``."""
    import redis  # noqa: PLC0415 - the embedded profile runs without it

    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return _clients[url]
