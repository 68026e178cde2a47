"""The one way Ferry's gRPC interceptors wrap a call: a function around each unary behaviour and
one around each server-streaming behaviour, the handler otherwise unchanged.

The gateway is a grpc.aio server: most behaviours are still plain functions (grpc runs them in
its migration thread pool, so Django's ORM code is unchanged), some are coroutines or async
generators (WatchHints, the health service).  A wrapper must keep its behaviour's kind, or grpc
would run a coroutine in a thread; so an interceptor gives a wrapper per kind, and a kind it
gives none for passes through unwrapped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import grpc

Wrap = Callable[[Callable], Callable]


def is_async(behaviour: Callable) -> bool:
    """A coroutine function or an async generator function: grpc.aio runs it on its event loop."""
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)


def wrap_handler(
    handler: grpc.RpcMethodHandler | None,
    unary: Wrap,
    stream: Wrap,
    *,
    awaited: Wrap | None = None,
    async_stream: Wrap | None = None,
):
    """The handler with its behaviour wrapped; None (an unknown method) stays None.

    unary and stream wrap plain functions (a sync unary call, a generator); ``awaited`` wraps
    coroutine functions (an async unary call, or a stream written with context.write, as the
    health service's Watch is); ``async_stream`` wraps async generators."""
    if handler is None:
        return None
    if handler.unary_unary is not None:
        wrap = _pick(handler.unary_unary, unary, awaited, None)
        if wrap is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            wrap(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        wrap = _pick(handler.unary_stream, stream, awaited, async_stream)
        if wrap is None:
            return handler
        return grpc.unary_stream_rpc_method_handler(
            wrap(handler.unary_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler  # no client-streaming methods in the contract


def _pick(behaviour: Callable, plain: Wrap, awaited: Wrap | None, async_stream: Wrap | None) -> Wrap | None:
    if inspect.isasyncgenfunction(behaviour):
        return async_stream
    if inspect.iscoroutinefunction(behaviour):
        return awaited
    return plain


class _Details(grpc.HandlerCallDetails):
    """What an interceptor is told of a method when it wraps it at registration: its name (no
    call's metadata: a cacheable interceptor's wrapping does not depend on one)."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class _Registrar:
    """Stands in for the server while a generated add_*Servicer_to_server registers a servicer:
    keeps its method handlers (the generic handler it also adds holds the same ones)."""

    def __init__(self) -> None:
        self.services: list[tuple[str, dict[str, grpc.RpcMethodHandler]]] = []

    def add_generic_rpc_handlers(self, _handlers) -> None:
        pass

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.services.append((service, handlers))


def add_intercepted(
    add: Callable[[object, object], None],
    servicer: object,
    server: grpc.aio.Server,
    interceptors: Sequence[grpc.ServerInterceptor],
) -> None:
    """Register ``servicer`` on ``server`` (``add`` is the generated add_*Servicer_to_server) with
    each method's handler wrapped once, now, by ``interceptors`` (the first outermost), instead
    of installing them as grpc.aio interceptors: those run per call (an interceptor pipeline of
    coroutines and a handler lookup each time), these cost nothing per call but the wrappers.

    Only interceptors whose wrapping depends on the handler and the method's name alone
    (``cacheable = True``) can be applied this way."""
    for interceptor in interceptors:
        if not getattr(interceptor, "cacheable", False):
            raise ValueError(
                f"{type(interceptor).__name__} wraps per call: it cannot be applied at registration"
            )
    registrar = _Registrar()
    add(servicer, registrar)
    for service, handlers in registrar.services:
        wrapped = {
            name: _intercept(handler, f"/{service}/{name}", interceptors)
            for name, handler in handlers.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        server.add_registered_method_handlers(service, wrapped)


def _intercept(
    handler: grpc.RpcMethodHandler, method: str, interceptors: Sequence[grpc.ServerInterceptor]
) -> grpc.RpcMethodHandler:
    details = _Details(method)
    for interceptor in reversed(interceptors):  # the innermost wraps first
        handler = interceptor.intercept_service(_Resolved(handler), details)
    return handler


class _Resolved:
    """A continuation that returns the handler already resolved."""

    __slots__ = ("handler",)

    def __init__(self, handler: grpc.RpcMethodHandler | None) -> None:
        self.handler = handler

    def __call__(self, _details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handler
