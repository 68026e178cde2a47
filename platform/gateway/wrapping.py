"""The one way Ferry's gRPC interceptors wrap a call: a function around each unary behaviour and
one around each server-streaming behaviour, the handler otherwise unchanged."""

from __future__ import annotations

from collections.abc import Callable

import grpc

Wrap = Callable[[Callable], Callable]


def wrap_handler(handler: grpc.RpcMethodHandler | None, unary: Wrap, stream: Wrap):
    """The handler with its behaviour wrapped; None (an unknown method) stays None."""
    if handler is None:
        return None
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            unary(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            stream(handler.unary_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler  # no client-streaming methods in the contract
