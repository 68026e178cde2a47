"""Build and run the gateway's gRPC server."""

from __future__ import annotations

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
from gateway.servicer import AgentGatewayServicer
from gateway.tls import enrol_address_for, server_credentials
from gateway.wrapping import wrap_handler


class ReleaseDatabaseConnections(grpc.ServerInterceptor):
    """What Django's request_finished does for HTTP: after every call, close a connection that is
    past CONN_MAX_AGE (or broken), so gateway threads do not pin database sessions."""

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


class Bound(tuple):
    """(server, port) as build_server always returned, plus the enrolment port as .enrol_port."""

    enrol_port: int

    def __new__(cls, server: grpc.Server, port: int, enrol_port: int) -> Bound:
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

    Each open WatchHints stream holds a worker thread, so the pool has room for the hub's
    watchers on top of ``workers`` for unary calls; past that, agents are told to poll.
    """
    hub = hub or HintHub.from_settings()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers + hub.max_watchers),
        # outermost first: the metrics and the log line cover the connection release too
        interceptors=[ObservabilityInterceptor(), DomainErrorInterceptor(), ReleaseDatabaseConnections()],
    )
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(AgentGatewayServicer(hub), server)
    health_pb2_grpc.add_HealthServicer_to_server((health or GatewayHealth()).servicer, server)
    port = server.add_secure_port(address, server_credentials(require_client_certificate=True))
    if port == 0:
        raise RuntimeError(f"cannot listen on {address}")
    enrol_address = enrol_address or enrol_address_for(address)
    enrol_port = server.add_secure_port(enrol_address, server_credentials(require_client_certificate=False))
    if enrol_port == 0:
        raise RuntimeError(f"cannot listen on {enrol_address} (the enrolment port)")
    return Bound(server, port, enrol_port)
