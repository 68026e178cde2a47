"""Build and run the gateway's gRPC server: a grpc.aio server on an event loop thread of its own.

WatchHints streams are async generators on that loop (gateway.watch), so an open stream costs
no thread; every other call is the servicer's synchronous Django code, which grpc.aio runs in
its migration thread pool of ``workers`` threads.  GatewayServer gives the callers (the
``gateway`` command, tests, benches) the blocking start/stop they had with grpc.server.

Several gateway processes may listen on one port: grpc sets SO_REUSEPORT on Linux, so the
kernel spreads new connections over them; hints reach every process through Redis.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
from django.db import close_old_connections
from grpc_health.v1 import health_pb2_grpc

from deploy.proto import agent_pb2_grpc
from gateway.errors import DomainErrorInterceptor
from gateway.health import GatewayHealth
from gateway.hints import HintHub
from gateway.interceptors import ObservabilityInterceptor
from gateway.tls import enrol_address_for, server_credentials
from gateway.watch import AioGatewayServicer
from gateway.wrapping import add_intercepted, wrap_handler

START_SECONDS = 30.0
ORM_THREADS = 4
# grpc core cancels a call that waits longer than this (default 30 s) for the server's event loop
# to pick it up: in a reconnect storm of thousands of streams that is where they queue, and a
# cancelled stream is one more reconnect, so they wait instead.
UNREQUESTED_SECONDS = 600
# grpc core also sheds calls waiting for the loop by their number: past 1,000 it cancels a new
# call with a rising probability (random early detection), past 3,000 every one.  A reconnect
# storm of the streams a process may hold queues that many on a busy loop (bench/fleet_storm.py
# --peer-slow-ms shows it on a trivial grpc.aio server), so the limit is what the hub may hold
# and some, and the client sees CANCELLED for none of them.
PENDING_CALLS_OVER_STREAMS = 10_000


def server_options(max_streams: int) -> list[tuple[str, int]]:
    """The grpc.aio server's options for a hub holding up to max_streams WatchHints streams."""
    pending = max_streams + PENDING_CALLS_OVER_STREAMS
    return [
        ("grpc.server_max_unrequested_time_in_server", UNREQUESTED_SECONDS),
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]


class ReleaseDatabaseConnections(grpc.ServerInterceptor):
    """What Django's request_finished does for HTTP: after every call, close a connection that is
    past CONN_MAX_AGE (or broken), so gateway threads do not pin database sessions.  Async
    behaviours run on the event loop, which holds no connection: they pass unwrapped."""

    cacheable = True  # the same wrapping for every call: wrapping.add_intercepted applies it once

    def intercept_service(self, continuation, handler_call_details):
        return wrap_handler(continuation(handler_call_details), _unary, _streaming)


def _unary(behaviour: Callable) -> Callable:
    def wrapped(request, context):
        try:
            return behaviour(request, context)
        finally:
            close_old_connections()

    return wrapped


def _streaming(behaviour: Callable) -> Callable:
    def wrapped(request, context) -> Iterator:
        try:
            yield from behaviour(request, context)
        finally:
            close_old_connections()

    return wrapped


class GatewayServer:
    """A grpc.aio server, its hint hub and health, on an event loop run by a daemon thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.loop = loop
        self._thread = thread
        self.server: grpc.aio.Server | None = None
        self.hub: HintHub | None = None
        self.health: GatewayHealth | None = None
        self.pool: futures.ThreadPoolExecutor | None = None

    def _call(self, coroutine, timeout: float | None = START_SECONDS):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def start(self) -> None:
        self._call(self._start())

    async def _start(self) -> None:
        self.hub.start(asyncio.get_running_loop())
        await self.health.attach()  # NOT_SERVING before the first call can ask
        await self.server.start()

    def stop(self, grace: float | None = None) -> threading.Event:
        """Stop serving (open streams end after grace seconds, or at once) and end the loop;
        blocks until done, and returns a set Event, as grpc.Server.stop's callers expect."""
        stopped = threading.Event()
        if not self.loop.is_closed():
            self._call(self._stop(grace), timeout=(grace or 0) + START_SECONDS)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=START_SECONDS)
            self.loop.close()
        stopped.set()
        return stopped

    async def _stop(self, grace: float | None) -> None:
        await self.server.stop(grace)
        self.hub.stop()
        # what is left (the hub's listener, streams' tasks) ends here, not in a closed loop
        current = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not current]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=START_SECONDS)
        self.pool.shutdown(wait=False)
        await asyncio.get_running_loop().shutdown_default_executor()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Bound(tuple):
    """(server, port) as build_server always returned, plus the enrolment port as .enrol_port."""

    enrol_port: int

    def __new__(cls, server: GatewayServer, port: int, enrol_port: int) -> Bound:
        bound = super().__new__(cls, (server, port))
        bound.enrol_port = enrol_port
        return bound


def build_server(
    address: str,
    *,
    workers: int = 16,
    hub: HintHub | None = None,
    health: GatewayHealth | None = None,
    enrol_address: str = "",
) -> Bound:
    """A server with mutual TLS on address ("host:port"; port 0 picks a free one) and
    server-only TLS for enrolment on enrol_address (default: gateway.tls.enrol_address_for);
    returns (server, port) with .enrol_port.

    It also answers grpc.health.v1 from ``health`` (NOT_SERVING until that checks the
    database: `manage.py gateway` starts its checks), and every call is counted and logged.
    ``workers`` threads run the synchronous calls; WatchHints streams need none.
    """
    loop = asyncio.new_event_loop()
    # the ORM work of the event loop's own (stream authentication, the hub's polls): a few threads
    loop.set_default_executor(
        futures.ThreadPoolExecutor(max_workers=ORM_THREADS, thread_name_prefix="gateway-orm")
    )
    thread = threading.Thread(target=loop.run_forever, name="gateway-loop", daemon=True)
    thread.start()
    gateway = GatewayServer(loop, thread)
    gateway.hub = hub or HintHub.from_settings()
    gateway.health = health or GatewayHealth()
    try:
        port, enrol_port = gateway._call(_listen(gateway, address, enrol_address, workers))
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=START_SECONDS)
        loop.close()
        raise
    return Bound(gateway, port, enrol_port)


async def _listen(gateway: GatewayServer, address: str, enrol_address: str, workers: int) -> tuple[int, int]:
    """Create the aio server on its loop (grpc.aio binds a server to the loop it is made on)."""
    gateway.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gateway")
    options = server_options(gateway.hub.max_watchers)
    server = grpc.aio.server(migration_thread_pool=gateway.pool, options=options)
    gateway.server = server
    # wrapped once per method at registration, not as grpc.aio interceptors (a coroutine pipeline
    # per call); outermost first: the metrics and the log line cover the connection release too
    interceptors = (ObservabilityInterceptor(), DomainErrorInterceptor(), ReleaseDatabaseConnections())
    servicer = AioGatewayServicer(gateway.hub, pool=gateway.pool)
    add_intercepted(agent_pb2_grpc.add_AgentGatewayServicer_to_server, servicer, server, interceptors)
    add_intercepted(
        health_pb2_grpc.add_HealthServicer_to_server, gateway.health.servicer, server, interceptors
    )
    port = server.add_secure_port(address, server_credentials(require_client_certificate=True))
    if port == 0:
        raise RuntimeError(f"cannot listen on {address}")
    enrol_address = enrol_address or enrol_address_for(address)
    enrol_port = server.add_secure_port(enrol_address, server_credentials(require_client_certificate=False))
    if enrol_port == 0:
        raise RuntimeError(f"cannot listen on {enrol_address} (the enrolment port)")
    return port, enrol_port
