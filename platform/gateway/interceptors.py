"""Metrics and one structured log line per RPC, as a server interceptor.

Every call gets a request id (an x-request-id metadata value if well formed) and, when the
caller presented a client certificate, the device id it names (verified by TLS), bound to
the log context so the servicer's own lines carry them too.  Plain behaviours (run in grpc's
thread pool) and async ones (WatchHints, health) are wrapped alike; wrapping.ForAio installs
the interceptor on the grpc.aio server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import structlog
from ferry_cloud.observability.context import request_id_from

from deploy.proto import agent_pb2
from gateway import metrics
from gateway.tls import peer_device_id
from gateway.wrapping import wrap_handler

log = structlog.get_logger("ferry.rpc")
WATCH_HINTS = "WatchHints"
# Health probes arrive every few seconds: their lines are debug.
QUIET_SERVICES = ("grpc.health.v1.Health",)


class ObservabilityInterceptor(grpc.ServerInterceptor):
    # What it wraps a handler with depends on the handler and the method's name only (a call's
    # own state is made when it runs), so wrapping.ForAio wraps each method once, not per call.
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
        self.seconds = metrics.RPC_SECONDS.labels(self.name)
        self._counts: dict[grpc.StatusCode, Any] = {}

    def count(self, code: grpc.StatusCode) -> Any:
        counter = self._counts.get(code)
        if counter is None:
            counter = self._counts[code] = metrics.RPCS.labels(self.name, code.name)
        return counter

    def wrap_unary(self, behaviour: Callable) -> Callable:
        def wrapped(request, context):
            return _Call(self, context).unary(behaviour, request, context)

        return wrapped

    def wrap_stream(self, behaviour: Callable) -> Callable:
        def wrapped(request, context) -> Iterator:
            yield from _Call(self, context).stream(behaviour, request, context)

        return wrapped

    def wrap_awaited(self, behaviour: Callable) -> Callable:
        """A coroutine behaviour: an async unary call, or a stream written with context.write."""

        async def wrapped(request, context):
            return await _Call(self, context).awaited(behaviour, request, context)

        return wrapped

    def wrap_async_stream(self, behaviour: Callable) -> Callable:
        # written out here, not delegated: an async generator closed mid-stream must run its
        # finally at once (an inner one would be closed only when collected)
        async def wrapped(request, context) -> AsyncIterator:
            call = _Call(self, context)
            started = call._bind(context)
            code = grpc.StatusCode.UNKNOWN
            watching = self.method == WATCH_HINTS
            if watching:
                metrics.HINT_STREAMS.inc()
            try:
                async for response in behaviour(request, context):
                    call._count_chunk(response)
                    yield response
                code = _code(context, grpc.StatusCode.OK)
            except (asyncio.CancelledError, GeneratorExit):
                code = grpc.StatusCode.CANCELLED  # the client went away mid-stream
                raise
            except Exception:
                code = _code(context, grpc.StatusCode.UNKNOWN)
                raise
            finally:
                if watching:
                    metrics.HINT_STREAMS.dec()
                call._finish(code, started)

        return wrapped


class _Call:
    """One call: its request id (from its metadata) and the device it comes from."""

    def __init__(self, method: _Method, context: grpc.ServicerContext) -> None:
        self.of = method
        self.service = method.service
        self.method = method.method
        metadata = context.invocation_metadata() or ()
        asked = next((v for k, v in metadata if k == "x-request-id" and isinstance(v, str)), None)
        self.request_id = request_id_from(asked)
        self.device_id: str | None = None  # read from the TLS peer when the call runs

    def unary(self, behaviour: Callable, request: Any, context: grpc.ServicerContext) -> Any:
        context = _CodeKeeper(context)
        started = self._bind(context)
        code = grpc.StatusCode.UNKNOWN
        try:
            response = behaviour(request, context)
            code = _code(context, grpc.StatusCode.OK)
            self._count_response(response, code)
            return response
        except Exception:
            code = _code(context, grpc.StatusCode.UNKNOWN)
            raise
        finally:
            self._finish(code, started)

    def stream(self, behaviour: Callable, request: Any, context: grpc.ServicerContext) -> Iterator:
        context = _CodeKeeper(context)
        started = self._bind(context)
        code = grpc.StatusCode.UNKNOWN
        watching = self.method == WATCH_HINTS
        if watching:
            metrics.HINT_STREAMS.inc()
        try:
            for response in behaviour(request, context):
                self._count_chunk(response)
                yield response
            code = _code(context, grpc.StatusCode.OK)
        except GeneratorExit:
            code = grpc.StatusCode.CANCELLED  # the client went away mid-stream
            raise
        except Exception:
            code = _code(context, grpc.StatusCode.UNKNOWN)
            raise
        finally:
            if watching:
                metrics.HINT_STREAMS.dec()
            self._finish(code, started)

    async def awaited(self, behaviour: Callable, request: Any, context: grpc.ServicerContext) -> Any:
        started = self._bind(context)
        code = grpc.StatusCode.UNKNOWN
        try:
            response = await behaviour(request, context)
            code = _code(context, grpc.StatusCode.OK)
            self._count_response(response, code)
            return response
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            code = _code(context, grpc.StatusCode.UNKNOWN)
            raise
        finally:
            self._finish(code, started)

    def _bind(self, context: grpc.ServicerContext) -> float:
        structlog.contextvars.clear_contextvars()
        self.device_id = peer_device_id(context)
        fields: dict[str, Any] = {"request_id": self.request_id}
        if self.device_id:
            fields["device_id"] = self.device_id
        structlog.contextvars.bind_contextvars(**fields)
        return time.perf_counter()

    def _count_response(self, response: Any, code: grpc.StatusCode) -> None:
        if code != grpc.StatusCode.OK or response is None:
            return
        if self.method == "CheckIn":
            metrics.CHECK_INS.labels("yes" if response.HasField("desired") else "no").inc()
        elif self.method == "ReportTelemetry":
            metrics.TELEMETRY_RECORDS.labels("stored").inc(len(response.stored_seqs))
            metrics.TELEMETRY_RECORDS.labels("duplicate").inc(len(response.duplicate_seqs))
        elif self.method == "Enrol" and response.grant:
            self.device_id = agent_pb2.EnrolGrant.FromString(response.grant).device_id or None

    def _count_chunk(self, response: Any) -> None:
        if self.method == "DownloadPackage":
            metrics.PACKAGE_BYTES.inc(len(response.data))

    def _finish(self, code: grpc.StatusCode, started: float) -> None:
        seconds = time.perf_counter() - started
        name = self.of.name
        self.of.count(code).inc()
        self.of.seconds.observe(seconds)
        level = logging.DEBUG if self.of.quiet else logging.INFO
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED) and level == logging.INFO:
            level = logging.WARNING
        fields: dict[str, Any] = {
            "method": name,
            "code": code.name,
            "duration_ms": round(seconds * 1000.0, 3),
        }
        if self.device_id:
            fields["device_id"] = self.device_id
        log.log(level, "rpc", **fields)
        structlog.contextvars.clear_contextvars()


def _code(context: grpc.ServicerContext, default: grpc.StatusCode) -> grpc.StatusCode:
    """The code the servicer set (abort or set_code), else the default for how the call ended."""
    try:
        code = context.code()
    except (AttributeError, NotImplementedError):
        return default
    if isinstance(code, grpc.StatusCode):
        return code
    return default
