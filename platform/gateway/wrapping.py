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
from collections.abc import Callable

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


class ForAio(grpc.aio.ServerInterceptor):
    """grpc.ServerInterceptors written in the wrap_handler style, installed on a grpc.aio server
    (which accepts only grpc.aio.ServerInterceptor): the handler is resolved asynchronously once,
    then the interceptors wrap it exactly as they would on a synchronous server, the first
    outermost.  One ForAio for several costs one await per call instead of one each."""

    def __init__(self, *interceptors: grpc.ServerInterceptor) -> None:
        self.interceptors = interceptors[::-1]  # innermost wraps first
        # interceptors whose wrapping depends on the handler and method name only (``cacheable``)
        # wrap each method once: method name -> (the handler, wrapped)
        self.cacheable = all(getattr(i, "cacheable", False) for i in interceptors)
        self._wrapped: dict[str, tuple[object, object]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if not self.cacheable:
            return self._wrap(handler, handler_call_details)
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, handler_call_details)
        if handler is not None:
            self._wrapped[handler_call_details.method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler, handler_call_details):
        for interceptor in self.interceptors:
            handler = interceptor.intercept_service(_Resolved(handler), handler_call_details)
        return handler


class _Resolved:
    """A continuation that returns the handler already resolved."""

    __slots__ = ("handler",)

    def __init__(self, handler: grpc.RpcMethodHandler | None) -> None:
        self.handler = handler

    def __call__(self, _details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handler
