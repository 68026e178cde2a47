"""A chat-completions request body, checked field by field (it crosses a process boundary)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.llm_api.errors import invalid, json_object

ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_BODY_BYTES = 1 << 20
MAX_STOPS = 4


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, str]]
    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False


def parse_chat_request(body: bytes) -> ChatRequest:
    """The request in ``body`` (JSON), or ApiError 400 naming the field at fault."""
    data = json_object(body)
    n = data.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise invalid("only n=1 is supported")
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    return ChatRequest(
        messages=_messages(data.get("messages")),
        model=_text(data, "model"),
        max_tokens=_integer(max_tokens, "max_tokens", 1),
        temperature=_number(data.get("temperature"), "temperature", 0.0, 2.0),
        top_p=_number(data.get("top_p"), "top_p", 0.0, 1.0, open_low=True),
        stop=_stops(data.get("stop")),
        seed=_integer(data.get("seed"), "seed", -(2**63)),
        stream=_flag(data.get("stream"), "stream"),
    )


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty array of {role, content}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise invalid(f"messages[{i}] needs a role, one of {', '.join(ROLES)}")
        messages.append({"role": message["role"], "content": _content(message.get("content"), i)})
    return messages


def _content(value: Any, i: int) -> str:
    """A string, or an array of text parts (joined); images and audio are refused."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        parts = []
        for part in value:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid(f"messages[{i}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(f"messages[{i}].content must be a string or an array of text parts")


def _text(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 256:
        raise invalid(f"'{name}' must be a string of at most 256 characters")
    return value


def _integer(value: Any, name: str, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**63:
        raise invalid(f"'{name}' must be an integer >= {low}, got {value!r}"[:200])
    return value


def _number(value: Any, name: str, low: float, high: float, open_low: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"'{name}' must be a number, got {value!r}"[:200])
    if value > high or value < low or (open_low and value == low):
        bracket = "(" if open_low else "["
        raise invalid(f"'{name}'={value} must be in {bracket}{low}, {high}]")
    return float(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) for s in stops):
        raise invalid(f"'stop' must be a string or an array of at most {MAX_STOPS} strings")
    return tuple(s for s in stops if s)


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be true or false")
    return value
