"""The tests' HTTP client for the local chat API: plain urllib, JSON in and out, an error's body kept."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def request_json(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    """GET ``url`` (POST ``body`` as JSON when given): the status and the decoded JSON answer,
    for a 4xx/5xx too (the API answers errors in OpenAI's JSON shape)."""
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
