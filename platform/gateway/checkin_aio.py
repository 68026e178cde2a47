"""CheckIn on the grpc.aio gateway's event loop: the no-change check-in answered inline.

A check-in the memory can answer (gateway.checkin_fast: dictionary reads, no SQL, no Redis)
is answered on the loop itself, so it costs no hop to a pool thread and back.  Everything else
(a first check-in, a changed report, a hinted one: that reads Redis, the computed answer: the
ORM) runs the servicer's synchronous check-in in the gateway's thread pool, given a ThreadContext
instead of grpc.aio's context (which belongs to the loop); its aborts and domain errors become
``await context.abort`` back on the loop, with the statuses gateway.errors gives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from django.db import close_old_connections
from ferry_cloud.errors import DomainError

from deploy.proto import agent_pb2
from gateway.errors import status_for
from gateway.interceptors import call_device_id
from gateway.servicer import add_key_rotations


class Aborted(Exception):
    """What ThreadContext.abort raises in the pool thread: the status the loop ends the call with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class ThreadContext:
    """The part of a grpc.ServicerContext the synchronous check-in uses, safe off the loop: the
    peer's auth context read on the loop beforehand, and abort, which raises Aborted."""

    def __init__(self, auth: dict[str, list[bytes]]) -> None:
        self._auth = auth

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)


def _in_thread(body: Callable, request: Any, context: ThreadContext) -> Any:
    """The synchronous body in a pool thread; its connection released after, as
    server.ReleaseDatabaseConnections does for the synchronous calls."""
    try:
        return body(request, context)
    finally:
        close_old_connections()


async def check_in(
    known: Any,
    body: Callable[[agent_pb2.CheckInRequest, ThreadContext], agent_pb2.CheckInResponse],
    request: agent_pb2.CheckInRequest,
    context: grpc.aio.ServicerContext,
    pool: futures.Executor | None,
) -> agent_pb2.CheckInResponse:
    """``known.answer`` inline when it needs no I/O (not hinted: a hint makes it read Redis),
    else ``body`` (the synchronous check-in, key rotations included) in ``pool``."""
    if not request.hinted:
        device_id = call_device_id(context)  # read once per call, by the interceptor
        response = known.answer(device_id, request) if device_id is not None else None
        if response is not None:
            # a stat of the rotation file (cached by its identity), as the synchronous path does
            add_key_rotations(response, request.key_rotation_sequence)
            return response
    thread_context = ThreadContext(context.auth_context())
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(pool, _in_thread, body, request, thread_context)
    except Aborted as aborted:
        await context.abort(aborted.code, aborted.details)
    except DomainError as exc:
        await context.abort(status_for(exc), str(exc))
