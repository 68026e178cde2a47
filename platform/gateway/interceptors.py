"""Metrics and one structured log line per RPC, as a server interceptor.

Every call gets a request id (an x-request-id metadata value if well formed) and, when the
caller presented a client certificate, the device id it names (verified by TLS), bound to
the log context so the servicer's own lines carry them too.  Plain behaviours (run in grpc's
thread pool) and async ones (CheckIn, WatchHints, health) are wrapped alike, and every kind
shares one bookkeeping (_Call: a context manager around the behaviour); wrapping.add_intercepted
applies the interceptor once per method when the server is built.

A no-change check-in costs the gateway a few hundred microseconds in all, so what runs per call
here is kept to the few steps it needs: metric children resolved once per method, the device id
read once per call (call_device_id hands it on to the servicer), the log line built only when
its level is enabled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import grpc
import structlog
from ferry_cloud.observability.context import request_id_from

from deploy.proto import agent_pb2
from gateway import metrics
from gateway.tls import peer_device_id
from gateway.wrapping import wrap_handler

log = structlog.get_logger("ferry.rpc")
_std_log = logging.getLogger("ferry.rpc")  # its isEnabledFor is cached by logging: the cheap check
WATCH_HINTS = "WatchHints"
# Health probes arrive every few seconds: their lines are debug.
QUIET_SERVICES = ("grpc.health.v1.Health",)
_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN
# a generated request id: this process's random prefix and a counter (unique as a uuid4 is, at a
# fraction of its cost per call)
_ID_PREFIX = os.urandom(6).hex()
_ids = itertools.count(1)
# (the call's context, the device id read from it) of the async call running in this task
_CALL_DEVICE: ContextVar[tuple[Any, str | None] | None] = ContextVar("ferry_rpc_device", default=None)


def call_device_id(context: Any) -> str | None:
    """The device id of the call ``context`` belongs to: the one this interceptor read already when
    it wraps the call (same context object), else read from the TLS peer now."""
    read = _CALL_DEVICE.get()
    if read is not None and read[0] is context:
        return read[1]
    return peer_device_id(context)


class ObservabilityInterceptor(grpc.ServerInterceptor):
    # What it wraps a handler with depends on the handler and the method's name only (a call's
    # own state is made when it runs), so it is applied once per method (wrapping.add_intercepted).
    cacheable = True

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = _Method(handler_call_details.method)
        return wrap_handler(
            handler,
            method.wrap_unary,
            method.wrap_stream,
            awaited=method.wrap_awaited,
            async_stream=method.wrap_async_stream,
        )


class _CodeKeeper:
    """The context a plain behaviour sees, remembering the status it ends the call with: the
    context grpc.aio gives a behaviour it runs in a thread has no code() to ask afterwards."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context
        self._code: grpc.StatusCode | None = None

    def abort(self, code: grpc.StatusCode, *args) -> None:
        self._code = code
        self._context.abort(code, *args)  # raises

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def code(self) -> grpc.StatusCode | None:
        if self._code is not None:
            return self._code
        asked = getattr(self._context, "code", None)
        return asked() if asked is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class _Method:
    """One method's names and metric children, and the wrappers of its behaviour."""

    def __init__(self, full_name: str) -> None:
        self.service, _, self.method = full_name.lstrip("/").rpartition("/")
        self.name = f"{self.service.rsplit('.', 1)[-1]}/{self.method}"
        self.quiet = self.service in QUIET_SERVICES
        self.watching = self.method == WATCH_HINTS
        self.seconds = metrics.RPC_SECONDS.labels(self.name)
        self._counts: dict[grpc.StatusCode, Any] = {_OK: metrics.RPCS.labels(self.name, _OK.name)}
        self.count_response = _RESPONSE_COUNTERS.get(self.method)

    def count(self, code: grpc.StatusCode) -> Any:
        counter = self._counts.get(code)
        if counter is None:
            counter = self._counts[code] = metrics.RPCS.labels(self.name, code.name)
        return counter

    def wrap_unary(self, behaviour: Callable) -> Callable:
        def wrapped(request, context):
            context = _CodeKeeper(context)
            with _Call(self, context, threaded=True) as call:
                call.response = behaviour(request, context)
            return call.response

        return wrapped

    def wrap_awaited(self, behaviour: Callable) -> Callable:
        """A coroutine behaviour: an async unary call, or a stream written with context.write."""

        async def wrapped(request, context):
            with _Call(self, context, threaded=False) as call:
                call.response = await behaviour(request, context)
            return call.response

        return wrapped

    # The two streaming wrappers differ only in the loop (for / async for): what they record is
    # _Call's.  Each is written out rather than delegated, so a generator closed mid-stream
    # runs its finally at once (an inner one would be closed only when collected).
    def wrap_stream(self, behaviour: Callable) -> Callable:
        def wrapped(request, context) -> Iterator:
            context = _CodeKeeper(context)
            with _Call(self, context, threaded=True) as call:
                for response in behaviour(request, context):
                    call.chunk(response)
                    yield response

        return wrapped

    def wrap_async_stream(self, behaviour: Callable) -> Callable:
        async def wrapped(request, context) -> AsyncIterator:
            with _Call(self, context, threaded=False) as call:
                async for response in behaviour(request, context):
                    call.chunk(response)
                    yield response

        return wrapped


class _Call:
    """One call, as a context manager around its behaviour: binds its request id and device to the
    log context on entry; on exit, the status it ended with, its metrics and its log line."""

    __slots__ = ("of", "context", "threaded", "device_id", "response", "started")

    def __init__(self, method: _Method, context: Any, *, threaded: bool) -> None:
        self.of = method
        self.context = context
        # a plain behaviour runs in a pool thread, whose log context outlives the call: it is
        # cleared on both sides; an async one runs in the call's own task (a fresh context)
        self.threaded = threaded
        self.response: Any = None

    def __enter__(self) -> _Call:
        context = self.context
        metadata = context.invocation_metadata() or ()
        asked = next((v for k, v in metadata if k == "x-request-id" and isinstance(v, str)), None)
        request_id = request_id_from(asked) if asked else f"{_ID_PREFIX}{next(_ids):x}"
        self.device_id = device_id = peer_device_id(context)
        if self.threaded:
            structlog.contextvars.clear_contextvars()
        else:
            _CALL_DEVICE.set((context, device_id))
        if device_id:
            structlog.contextvars.bind_contextvars(request_id=request_id, device_id=device_id)
        else:
            structlog.contextvars.bind_contextvars(request_id=request_id)
        if self.of.watching:
            metrics.HINT_STREAMS.inc()
        self.started = time.perf_counter()
        return self

    def chunk(self, response: Any) -> None:
        if self.of.method == "DownloadPackage":
            metrics.PACKAGE_BYTES.inc(len(response.data))

    def __exit__(self, kind: type[BaseException] | None, _exc, _tb) -> None:
        if kind is None:
            code = _code(self.context, _OK)
            if code is _OK and self.response is not None and self.of.count_response is not None:
                self.of.count_response(self)
        elif issubclass(kind, (asyncio.CancelledError, GeneratorExit)):
            code = _CANCELLED  # the client went away mid-call
        else:
            code = _code(self.context, _UNKNOWN)
        if self.of.watching:
            metrics.HINT_STREAMS.dec()
        self._finish(code)

    def _finish(self, code: grpc.StatusCode) -> None:
        of = self.of
        seconds = time.perf_counter() - self.started
        of.count(code).inc()
        of.seconds.observe(seconds)
        level = logging.DEBUG if of.quiet else logging.INFO
        if code is not _OK and code is not _CANCELLED and level == logging.INFO:
            level = logging.WARNING
        if _std_log.isEnabledFor(level):
            fields: dict[str, Any] = {
                "method": of.name,
                "code": code.name,
                "duration_ms": round(seconds * 1e3, 3),
            }
            if self.device_id:
                fields["device_id"] = self.device_id
            log.log(level, "rpc", **fields)
        if self.threaded:
            structlog.contextvars.clear_contextvars()


def _count_check_in(call: _Call) -> None:
    _OFFERED[call.response.HasField("desired")].inc()


def _count_telemetry(call: _Call) -> None:
    _STORED.inc(len(call.response.stored_seqs))
    _DUPLICATE.inc(len(call.response.duplicate_seqs))


def _count_enrol(call: _Call) -> None:
    if call.response.grant:  # the log line names the device the grant was made for
        call.device_id = agent_pb2.EnrolGrant.FromString(call.response.grant).device_id or None


_OFFERED = {True: metrics.CHECK_INS.labels("yes"), False: metrics.CHECK_INS.labels("no")}
_STORED = metrics.TELEMETRY_RECORDS.labels("stored")
_DUPLICATE = metrics.TELEMETRY_RECORDS.labels("duplicate")
_RESPONSE_COUNTERS: dict[str, Callable[[_Call], None]] = {
    "CheckIn": _count_check_in,
    "ReportTelemetry": _count_telemetry,
    "Enrol": _count_enrol,
}


def _code(context: grpc.ServicerContext, default: grpc.StatusCode) -> grpc.StatusCode:
    """The code the servicer set (abort or set_code), else the default for how the call ended."""
    try:
        code = context.code()
    except (AttributeError, NotImplementedError):
        return default
    if isinstance(code, grpc.StatusCode):
        return code
    return default
