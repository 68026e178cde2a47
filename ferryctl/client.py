"""The HTTP side: one httpx client, the API's error format, cursor pages and safe-to-retry creates."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any

import httpx

from ferryctl.config import Config

API = "/api/v1"
CREATE_ATTEMPTS = 3  # a create that timed out is sent again with the same Idempotency-Key
THROTTLED_ATTEMPTS = 4  # a 429 was not carried out: wait its Retry-After and send it again
LONGEST_WAIT = 60.0


class ApiError(Exception):
    """The server refused, in its own words ({"error": {code, message, fields?}})."""

    def __init__(self, status: int, code: str, message: str, fields: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or {}

    @property
    def exit_code(self) -> int:
        """2 for the caller's mistakes (4xx), 1 for everything else."""
        return 2 if 400 <= self.status < 500 else 1

    def describe(self) -> str:
        lines = [f"error: {self.message} ({self.status} {self.code})"]
        lines += [f"  {name}: {'; '.join(map(str, problems))}" for name, problems in self.fields.items()]
        return "\n".join(lines)


class TransportError(Exception):
    """The server could not be reached or did not answer in time."""


def _error_of(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        error = body["error"]
        fields = error.get("fields") if isinstance(error.get("fields"), dict) else None
        return ApiError(response.status_code, str(error["code"]), str(error["message"]), fields)
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:200] or response.reason_phrase
        return ApiError(response.status_code, "http_error", text)


class ReadProgress:
    """A file whose reads are reported (the upload's progress bar), otherwise the file itself."""

    def __init__(self, file: IO[bytes], advance: Callable[[int], None]):
        self._file = file
        self._advance = advance

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._advance(len(chunk))
        return chunk

    def __getattr__(self, name: str) -> Any:  # fileno, seek, tell, name: httpx sizes the body with them
        return getattr(self._file, name)


class Ferry:
    """The REST API of one Ferry server, as one user (its API token)."""

    def __init__(
        self, config: Config, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ):
        self.base = config.url
        self._http = httpx.Client(
            base_url=config.url,
            headers={"Authorization": f"Token {config.token}", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout, write=None),  # an upload takes as long as it takes
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, url: str, **kwargs: Any) -> Any:
        for attempt in range(1, THROTTLED_ATTEMPTS + 1):
            try:
                response = self._http.request(method, url, **kwargs)
            except httpx.TimeoutException as exc:
                raise TransportError(
                    f"{self.base} did not answer in time ({exc.__class__.__name__})."
                ) from exc
            except httpx.TransportError as exc:
                raise TransportError(f"Cannot reach {self.base}: {exc}.") from exc
            if response.status_code == 429 and attempt < THROTTLED_ATTEMPTS and "files" not in kwargs:
                time.sleep(retry_after(response))
                continue
            if response.status_code >= 400:
                raise _error_of(response)
            return response.json() if response.content else None
        raise AssertionError("unreachable")

    def stream(self, path: str, params: dict | None = None, last_event_id: str | None = None):
        """An open server-sent-events response (a context manager); ApiError if it is refused."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        request = self._http.build_request("GET", API + path, params=_clean(params), headers=headers)
        try:
            response = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise TransportError(f"Cannot reach {self.base}: {exc}.") from exc
        if response.status_code >= 400:
            response.read()
            response.close()
            raise _error_of(response)
        return response

    def delete(self, path: str) -> Any:
        return self._send("DELETE", API + path)

    def get(self, path: str, params: dict | None = None) -> Any:
        return self._send("GET", API + path, params=_clean(params))

    def post(self, path: str, body: dict | None = None) -> Any:
        return self._send("POST", API + path, json=body or {})

    def patch(self, path: str, body: dict) -> Any:
        return self._send("PATCH", API + path, json=body)

    def create(self, path: str, body: dict | None = None, **kwargs: Any) -> Any:
        """A POST that creates: the same Idempotency-Key on every attempt, so a retry after a
        timeout returns the first answer instead of making a second one."""
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        content = kwargs or {"json": body or {}}
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                return self._send("POST", API + path, headers=headers, **content)
            except TransportError:
                if attempt == CREATE_ATTEMPTS or "files" in kwargs:  # a read file cannot be re-sent
                    raise
        raise AssertionError("unreachable")

    def pages(self, path: str, params: dict | None = None, limit: int | None = None) -> Iterator[dict]:
        """Every row of a list, following its next links; at most `limit` rows if given."""
        query = _clean(params)
        if limit is not None:
            query["limit"] = min(limit, 500)
        url: str | None = API + path
        seen = 0
        while url:
            page = self._send("GET", url, params=query)
            for row in page["results"]:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield row
            url, query = page.get("next"), None  # the next link carries the filters


def retry_after(response: httpx.Response) -> float:
    """The server's Retry-After in seconds (at most a minute), 1 if it gave none."""
    try:
        return min(LONGEST_WAIT, max(0.0, float(response.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0


def _clean(params: dict | None) -> dict:
    return {k: v for k, v in (params or {}).items() if v is not None}
