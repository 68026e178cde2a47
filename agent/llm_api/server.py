"""The local chat API's HTTP door: POST /v1/chat/completions (JSON or server-sent events) and
GET /v1/models, on 127.0.0.1 by default or a UNIX socket.  Every failure is answered in
OpenAI's error shape; nothing a client sends takes the server down."""

from __future__ import annotations

import json
import logging
import os
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent.llm_api.chat_request import MAX_BODY_BYTES, parse_chat_request
from agent.llm_api.errors import ApiError, ClientGone
from agent.llm_api.images import IMAGES_PATH, handle_images
from agent.llm_api.service import Completion, LlmService

log = logging.getLogger(__name__)
DRAIN_BYTES = 16 << 20  # an oversized body up to this is read and dropped before the 413


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a client may stall mid-request (or mid-stream) before it is dropped

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.client_address, *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self._post)

    def _answer(self, action) -> None:
        try:
            action()
        except ApiError as exc:
            self.close_connection = True  # the body may be unread: do not reuse the connection
            self._json(exc.status, exc.body())
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            self.close_connection = True
        except Exception as exc:  # a bug or an engine failure: the request fails, the server stays
            log.exception("chat request failed")
            self.close_connection = True
            self._json(500, ApiError(500, f"{type(exc).__name__}: {exc}", "server_error").body())

    def _service(self) -> LlmService:
        service = self.server.service
        if service is None:
            raise ApiError(503, "no LLM package is active on this device", "server_error", "no_model")
        return service

    def _get(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            raise ApiError(404, f"no such endpoint: GET {self.path[:100]}", code="not_found")
        self._json(200, self._service().models())

    def _post(self) -> None:
        if self.path.rstrip("/") == IMAGES_PATH:  # a diffusion package's endpoint (images.py)
            return handle_images(self, self.server.service)
        if self.path.rstrip("/") != "/v1/chat/completions":
            raise ApiError(404, f"no such endpoint: POST {self.path[:100]}", code="not_found")
        request = parse_chat_request(self._body())
        service = self._service()
        if not request.stream:
            completion = service.complete(request)
            self._json(200, completion.body())
            return
        self._stream(service, request)

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError as exc:
            self.close_connection = True
            raise ApiError(411, "a Content-Length header is required", code="length_required") from exc
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self._discard(min(length, DRAIN_BYTES))  # so the client reads the 413, not a reset
            raise ApiError(413, f"the body is larger than {MAX_BODY_BYTES} bytes", code="too_large")
        return self.rfile.read(length)

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                return
            length -= len(chunk)

    def _stream(self, service: LlmService, request) -> None:
        """Server-sent events: a role chunk when generation starts, text chunks as they are final,
        a last chunk with the finish reason, then [DONE]."""
        chunk_id, created = f"chatcmpl-{os.urandom(12).hex()}", int(time.time())
        started = False

        def send(delta: dict[str, Any], finish: str | None = None) -> None:
            nonlocal started
            if not started:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                started = True
                send({"role": "assistant", "content": ""})
            chunk = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": request.model or service.name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            self._event(json.dumps(chunk))

        def on_text(text: str) -> None:
            try:
                send({"content": text})
            except OSError as exc:
                raise ClientGone() from exc

        self.close_connection = True
        try:
            completion: Completion = service.complete(request, on_text=on_text)
        except ApiError as exc:
            if not started:
                raise
            self._event(json.dumps(exc.body()))  # the headers are out: report in the stream
            self._event("[DONE]")
            return
        except ClientGone:
            raise
        except Exception as exc:
            if not started:
                raise
            log.exception("streamed chat request failed")
            self._event(json.dumps(ApiError(500, f"{type(exc).__name__}: {exc}", "server_error").body()))
            self._event("[DONE]")
            return
        send({}, completion.finish_reason)
        self._event("[DONE]")

    def _event(self, data: str) -> None:
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    service: LlmService | None = None


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    service: LlmService | None = None

    def get_request(self):  # http.server wants a (host, port) client address
        request, _ = super().get_request()
        return request, ("unix", 0)


class LlmApiServer:
    """The API on ``host:port`` (127.0.0.1 unless told) or on ``unix_socket``, in a thread.
    The served package can be swapped (the agent's activation) while it runs."""

    def __init__(
        self,
        service: LlmService | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        unix_socket: Path | None = None,
    ) -> None:
        if unix_socket is not None:
            Path(unix_socket).unlink(missing_ok=True)
            self._server: Any = _UnixServer(str(unix_socket), _Handler)
            os.chmod(unix_socket, 0o660)
        else:
            self._server = _Server((host, port), _Handler)
        self._server.service = service
        self._thread: threading.Thread | None = None
        self.unix_socket = unix_socket

    @property
    def address(self) -> str:
        if self.unix_socket is not None:
            return f"unix:{self.unix_socket}"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def service(self) -> LlmService | None:
        return self._server.service

    @service.setter
    def service(self, service: LlmService | None) -> None:
        self._server.service = service

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="llm-api", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        """Stop the thread ``start`` began, then close."""
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        self._server.server_close()
        if self.unix_socket is not None:
            Path(self.unix_socket).unlink(missing_ok=True)
