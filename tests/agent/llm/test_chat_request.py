"""Hostile request bodies: every one is a ChatRequest or a 400 in OpenAI's error shape, never
another exception (the body crosses a process boundary)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.llm_api.chat_request import ChatRequest, parse_chat_request
from agent.llm_api.errors import ApiError

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(
            st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "x", 1]), "content": JSON}),
            max_size=3,
        )
        | JSON,
        "max_tokens": JSON,
        "temperature": JSON,
        "top_p": JSON,
        "stop": JSON,
        "seed": JSON,
        "stream": JSON,
        "model": JSON,
        "n": JSON,
    },
)


def _parse(body: bytes) -> ChatRequest | None:
    try:
        return parse_chat_request(body)
    except ApiError as exc:
        assert exc.status == 400 and exc.body()["error"]["message"]
        return None


@settings(max_examples=300, deadline=None)
@given(FIELDS)
def test_any_json_object_is_a_request_or_a_400(data: dict) -> None:
    request = _parse(json.dumps(data).encode())
    if request is not None:
        assert request.messages and all(isinstance(m["content"], str) for m in request.messages)
        assert request.max_tokens is None or request.max_tokens >= 1
        assert request.temperature is None or 0 <= request.temperature <= 2


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_request_or_a_400(body: bytes) -> None:
    _parse(body)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, ChatRequest([{"role": "user", "content": "hi"}])),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ],
                "max_completion_tokens": 5,
                "temperature": 0,
                "top_p": 0.5,
                "stop": "\n",
                "seed": 3,
                "stream": True,
            },
            ChatRequest([{"role": "user", "content": "ab"}], "m", 5, 0.0, 0.5, ("\n",), 3, True),
        ),
    ],
)
def test_the_fields_are_read(body: dict, expected: ChatRequest) -> None:
    assert parse_chat_request(json.dumps(body).encode()) == expected
