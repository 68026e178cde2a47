"""Following the server's event stream (GET /api/v1/events/stream/, server-sent events).

The server ends each stream after a while (its FERRY_SSE_MAX_SECONDS) and the client is expected
to reconnect naming the last event it saw; follow() does that, and waits and retries when the
connection drops or the server has no stream free (503), so a caller sees one endless sequence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass

import httpx

from ferryctl.client import ApiError, Ferry, TransportError

RECONNECT_SECONDS = 1.0
LONGEST_WAIT = 30.0


@dataclass(frozen=True)
class Frame:
    id: str | None
    event: str | None
    data: str | None
    retry: int | None = None


def frames(lines: Iterator[str]) -> Iterator[Frame]:
    """Server-sent-event frames from text lines; a comment (a heartbeat) is an empty frame, so a
    reader notices time passing while nothing happens."""
    fields: dict[str, list[str]] = {}
    for line in lines:
        if line == "":
            if fields:
                retry = fields.get("retry", [""])[-1]
                yield Frame(
                    id=fields.get("id", [None])[-1],
                    event=fields.get("event", [None])[-1],
                    data="\n".join(fields["data"]) if "data" in fields else None,
                    retry=int(retry) if retry.isdigit() else None,
                )
                fields = {}
            continue
        if line.startswith(":"):
            yield Frame(id=None, event=None, data=None)
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value.removeprefix(" "))


def follow(
    ferry: Ferry,
    params: dict | None = None,
    *,
    deadline: float | None = None,
    last_event_id: str | None = None,
) -> Iterator[dict]:
    """Every event from now on (or after ``last_event_id``) as the feed's JSON rows, across
    reconnects, until ``deadline`` (time.monotonic()) if given. A refusal (4xx) is raised."""
    wait = RECONNECT_SECONDS
    while deadline is None or time.monotonic() < deadline:
        try:
            with closing(ferry.stream("/events/stream/", params, last_event_id)) as response:
                wait = RECONNECT_SECONDS
                for frame in frames(response.iter_lines()):
                    if frame.retry is not None:
                        wait = frame.retry / 1000
                    if frame.data is not None:
                        last_event_id = frame.id or last_event_id
                        yield json.loads(frame.data)
                    if deadline is not None and time.monotonic() >= deadline:
                        return
        except ApiError as exc:
            if exc.status != 503 and exc.status < 500:
                raise
            wait = min(LONGEST_WAIT, wait * 2)
        except (TransportError, httpx.HTTPError):
            wait = min(LONGEST_WAIT, wait * 2)  # a dropped connection: back off, then resume
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        time.sleep(wait)
