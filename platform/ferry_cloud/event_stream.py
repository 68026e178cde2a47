"""GET /api/v1/events/stream/: the organisation's event feed as server-sent events.

The same rows and filters as /api/v1/audit/, oldest first, each as ``id: <event id>``,
``event: <type>`` and ``data: <the feed's JSON row>``. A client resumes with ``Last-Event-ID``
(EventSource sends it by itself on reconnect; ``last_event_id`` in the query does the same for
a first connection) or starts at a time with ``after``; otherwise it hears what happens from now.

Why a bounded lifetime: gunicorn runs gthread workers (gunicorn_conf.py), where an open stream
holds one of a worker's FERRY_WEB_THREADS threads. So a stream ends after FERRY_SSE_MAX_SECONDS
(55) and the client reconnects with Last-Event-ID (losing nothing: ids are the feed's), and at
most FERRY_SSE_STREAMS_PER_PROCESS streams run per worker process, leaving threads for ordinary
requests (more: 503 with Retry-After). The stream polls the database every
FERRY_SSE_POLL_SECONDS (one indexed query) and sends a comment as heartbeat when quiet for
FERRY_SSE_HEARTBEAT_SECONDS, so proxies keep the connection and clients notice a dead one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from accounts.api import OrganisationApi
from accounts.permissions import ReadOnly
from django.conf import settings
from django.db.models import Q
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from releases.api import AuditEventOutput, AuditQuery
from releases.selectors import release_events
from rest_framework import exceptions, serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer

from ferry_cloud.api_lists import list_query

RETRY_MILLISECONDS = 1000  # how soon EventSource reconnects after the stream ends
LATE_COMMIT = timedelta(seconds=10)  # a row committed after a newer id was sent is still sent
BATCH = 500

LAST_EVENT_ID = OpenApiParameter(
    "Last-Event-ID",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Resume after this event id (EventSource sends it on reconnect).",
)


class TooManyStreams(exceptions.APIException):
    status_code = 503
    default_detail = "This server process runs as many event streams as it may; retry shortly."
    default_code = "too_many_streams"
    wait = 5  # DRF's handler turns it into Retry-After


class StreamQuery(AuditQuery):
    """The feed's filters, without paging; a stream has no end time."""

    last_event_id = serializers.IntegerField(
        required=False, min_value=0, max_value=2**63 - 1, help_text="As the Last-Event-ID header."
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for paging in ("limit", "cursor", "ordering", "before"):
            fields.pop(paging, None)
        return fields


class AnyAccept(BaseContentNegotiation):
    """Refusals answer JSON whatever the client accepts (EventSource sends text/event-stream)."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


_slots_lock = threading.Lock()
_slots: threading.BoundedSemaphore | None = None


def _stream_slots() -> threading.BoundedSemaphore:
    global _slots
    with _slots_lock:
        if _slots is None:
            _slots = threading.BoundedSemaphore(max(1, int(settings.FERRY_SSE_STREAMS_PER_PROCESS)))
        return _slots


class _Stream:
    """The response body; Django calls close() when the response ends (client gone included),
    which gives the process's stream slot back even if the body was never read."""

    def __init__(self, frames: Iterator[str], slot: threading.BoundedSemaphore) -> None:
        self._frames = frames
        self._slot: threading.BoundedSemaphore | None = slot

    def __iter__(self) -> Iterator[bytes]:
        for frame in self._frames:
            yield frame.encode()

    def close(self) -> None:
        self._frames.close()
        if self._slot is not None:
            self._slot.release()
            self._slot = None


def _frame(row: dict[str, Any]) -> str:
    data = json.dumps(row, separators=(",", ":"), default=str)
    return f"id: {row['id']}\nevent: {row['type']}\ndata: {data}\n\n"


def _start(request, query: dict[str, Any], events) -> tuple[int, dict[int, float]]:
    """The id to send after, and the recent ids below it that count as already seen."""
    header = request.headers.get("Last-Event-ID", "").strip()
    if header:
        if not header.isdigit() or len(header) > 18:
            raise serializers.ValidationError({"Last-Event-ID": ["Must be an event id (digits)."]})
        cursor = int(header)
    elif "last_event_id" in query:
        cursor = query["last_event_id"]
    elif query.get("after") is not None:
        first = events.filter(at__gte=query["after"]).order_by("pk").values_list("pk", flat=True).first()
        cursor = first - 1 if first is not None else _newest(events)
    else:
        cursor = _newest(events)
    recent = events.filter(pk__lte=cursor, at__gte=timezone.now() - LATE_COMMIT)
    now = time.monotonic()
    return cursor, {pk: now for pk in recent.values_list("pk", flat=True)}


def _newest(events) -> int:
    return events.order_by("-pk").values_list("pk", flat=True).first() or 0


def _frames(events, cursor: int, seen: dict[int, float]) -> Iterator[str]:
    """Frames until the stream's lifetime ends: new rows (and late commits), else heartbeats.

    Ids are given at insert, so a transaction may commit a row below an id already sent; rows
    younger than LATE_COMMIT below the cursor are looked at again, ``seen`` keeps them single."""
    yield f"retry: {RETRY_MILLISECONDS}\n\n"
    started = last_write = time.monotonic()
    lifetime, heartbeat = float(settings.FERRY_SSE_MAX_SECONDS), float(settings.FERRY_SSE_HEARTBEAT_SECONDS)
    poll = float(settings.FERRY_SSE_POLL_SECONDS)
    while True:
        late = Q(pk__lte=cursor, at__gte=timezone.now() - LATE_COMMIT) & ~Q(pk__in=list(seen))
        rows = list(events.filter(Q(pk__gt=cursor) | late).order_by("pk")[:BATCH])
        for row in AuditEventOutput(rows, many=True).data:
            yield _frame(row)
            seen[row["id"]] = last_write = time.monotonic()
            cursor = max(cursor, row["id"])
        if len(rows) == BATCH:
            continue  # a backlog: send it before sleeping
        now = time.monotonic()
        forget = now - 2 * LATE_COMMIT.total_seconds()
        seen = {pk: at for pk, at in seen.items() if at > forget}
        if now - started >= lifetime:
            yield ": the stream's lifetime is over; reconnect with Last-Event-ID\n\n"
            return
        if now - last_write >= heartbeat:
            yield ": heartbeat\n\n"
            last_write = now
        time.sleep(max(0.05, min(poll, lifetime - (now - started))))


class EventStreamApi(OrganisationApi):
    permission_classes = [ReadOnly]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = AnyAccept

    @extend_schema(
        parameters=[StreamQuery, LAST_EVENT_ID],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description="Server-sent events: `id` (the feed's event id), `event` (its type), `data` "
                "(the feed's JSON row). Ends after FERRY_SSE_MAX_SECONDS; reconnect with Last-Event-ID.",
            ),
            503: OpenApiResponse(description="This process runs its maximum of streams; see Retry-After."),
        },
        operation_id="v1_events_stream",
    )
    def get(self, request):
        """The organisation's events as they happen (server-sent events), with the audit feed's filters."""
        query = list_query(StreamQuery, request)
        events = release_events(
            organisation=self.organisation,
            release_id=query.get("release"),
            actor=query.get("actor"),
            types=sorted(query.get("type", ())),
        )
        cursor, seen = _start(request, query, events)
        if request.method == "HEAD":  # the headers only: no body, so no stream to hold open
            return _headers(StreamingHttpResponse(iter(())))
        slot = _stream_slots()
        if not slot.acquire(blocking=False):
            raise TooManyStreams()
        return _headers(StreamingHttpResponse(_Stream(_frames(events, cursor, seen), slot)))


def _headers(response: StreamingHttpResponse) -> StreamingHttpResponse:
    response["Content-Type"] = "text/event-stream; charset=utf-8"
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response
