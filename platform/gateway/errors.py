"""The gRPC door's half of the domain errors (ferry_cloud/errors.py): one table of status codes,
and the server interceptor that applies it to every call, so servicer methods just let
domain errors rise."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
from ferry_cloud.errors import Conflict, DomainError, Invalid, NotFound, PermissionDenied, Unauthenticated

from gateway.wrapping import wrap_handler

# First match wins; a DomainError of no family here is an invalid argument.
STATUS_OF: tuple[tuple[type[DomainError], grpc.StatusCode], ...] = (
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    # the request is fine but the state is not (a version with no package yet)
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (Invalid, grpc.StatusCode.INVALID_ARGUMENT),
)


def status_for(exc: DomainError) -> grpc.StatusCode:
    return next(
        (code for family, code in STATUS_OF if isinstance(exc, family)), grpc.StatusCode.INVALID_ARGUMENT
    )


def abort_with(context: grpc.ServicerContext, exc: DomainError) -> None:
    """End the call with the error's status and message (context.abort raises)."""
    context.abort(status_for(exc), str(exc))


class DomainErrorInterceptor(grpc.ServerInterceptor):
    """Turns a DomainError raised anywhere in a call (streams included) into its status."""

    cacheable = True  # the same wrapping for every call: wrapping.add_intercepted applies it once

    def intercept_service(self, continuation, handler_call_details):
        return wrap_handler(continuation(handler_call_details), _unary, _streaming)


def _unary(behaviour: Callable) -> Callable:
    def wrapped(request, context):
        try:
            return behaviour(request, context)
        except DomainError as exc:
            abort_with(context, exc)

    return wrapped


def _streaming(behaviour: Callable) -> Callable:
    def wrapped(request, context) -> Iterator:
        try:
            yield from behaviour(request, context)
        except DomainError as exc:
            abort_with(context, exc)

    return wrapped
