"""WatchHints on the grpc.aio gateway: an async generator per stream, no thread per stream.

The servicer's other methods stay synchronous Django code that grpc.aio runs in its migration
thread pool; WatchHints is replaced (AioGatewayServicer), because a stream mostly waits:
10,000 of them wait on one event loop, and so is CheckIn, whose no-change answer comes from
memory on the loop, with no hop to a thread and back (gateway.checkin_aio).  A stream's
device is authenticated in a worker thread (the ORM; the loop's default executor, a few
threads), then the stream waits on its hub mailbox
until a hint, its replacement, its device's revocation, the client leaving, or its
lifetime's end (the agent reopens it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator
from concurrent import futures

import grpc
from django.db import close_old_connections
from ferry_cloud.errors import DomainError
from fleet.services import device_for_certificate

from deploy.proto import agent_pb2
from gateway import checkin_aio
from gateway.errors import status_for
from gateway.hints import HintHub, StreamClosed
from gateway.metrics import HINT_SECONDS
from gateway.servicer import WATCH_MAX_SECONDS, AgentGatewayServicer
from gateway.tls import peer_device_id

log = logging.getLogger(__name__)
# Streams opened together (a reconnect storm) do not all end together: each lives a random
# fraction of WATCH_MAX_SECONDS, at least this much of it.
LIFETIME_SPREAD = 0.8


def _organisation_of(device_id: str) -> int:
    """The certificate's device, refused (DomainError) when unknown or revoked; its organisation."""
    close_old_connections()
    try:
        return device_for_certificate(device_id=device_id).organisation_id
    finally:
        # the stream holds no connection: this worker thread does, for the next lookup (a
        # reconnect storm must not open a database session per stream)
        close_old_connections()


def _lifetime() -> float:
    """FERRY_GATEWAY_WATCH_SECONDS, else the servicer's WATCH_MAX_SECONDS: how long a stream lives
    before the agent reopens it (a longer life: fewer reopens per second across a big fleet)."""
    return float(os.environ.get("FERRY_GATEWAY_WATCH_SECONDS", "") or WATCH_MAX_SECONDS)


class AioGatewayServicer(AgentGatewayServicer):
    """The agents' gateway servicer with WatchHints and CheckIn on the event loop; ``pool`` runs
    the check-ins memory cannot answer (None: the loop's default executor)."""

    def __init__(
        self,
        hub: HintHub | None = None,
        *,
        lifetime: float | None = None,
        pool: futures.Executor | None = None,
    ) -> None:
        super().__init__(hub)
        self.lifetime = lifetime or _lifetime()
        self.pool = pool

    async def CheckIn(self, request, context):  # noqa: N802 (gRPC's name)
        """A no-change check-in answered inline (gateway.checkin_aio), else the synchronous one."""
        return await checkin_aio.check_in(self.known, super().CheckIn, request, context, self.pool)

    async def WatchHints(self, request, context) -> AsyncIterator[agent_pb2.Hint]:  # noqa: N802 (gRPC's name)
        """Push a Hint whenever the device's organisation's releases change.

        One stream per device: opening another closes this one (ABORTED); revoking the device
        closes it (PERMISSION_DENIED); a full hub says RESOURCE_EXHAUSTED (keep polling)."""
        device_id = peer_device_id(context)
        if device_id is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "this call needs the device's client certificate: enrol first, then use the mutual-TLS port",
            )
        loop = asyncio.get_running_loop()
        try:
            organisation_id = await loop.run_in_executor(None, _organisation_of, device_id)
        except DomainError as exc:
            await context.abort(status_for(exc), str(exc))
        mailbox = await self.hub.watch(organisation_id, device_id)
        if mailbox is None:
            full = "too many open watch streams; keep polling"
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, full)
        deadline = loop.time() + self.lifetime * random.uniform(LIFETIME_SPREAD, 1.0)
        try:
            while (reason := await mailbox.next(deadline)) is not None:
                if isinstance(reason, StreamClosed):
                    code = grpc.StatusCode.PERMISSION_DENIED if reason.revoked else grpc.StatusCode.ABORTED
                    await context.abort(code, reason.message)
                # the wave's time to this stream: from the hub hearing the change to the hint handed
                # to grpc (which writes it at once; the generator resumes only when the loop is
                # back for it, later in a wave of thousands)
                HINT_SECONDS.observe(time.monotonic() - mailbox.since)
                yield agent_pb2.Hint(reason=reason)
            # lifetime over: the stream ends OK and the agent reopens it
        finally:
            self.hub.unsubscribe(organisation_id, mailbox)
