"""An LLM package's health check: generate greedily from the self-test prompt the converter
recorded and compare with the tokens it recorded (converter/llm/convert.py ``_selftest``)."""

from __future__ import annotations

import json
from pathlib import Path

from agent.errors import ActivationError


def llm_health_check(directory: Path) -> None:
    """Raise ActivationError unless the package loads and regenerates its self-test tokens."""
    from engine.llm.generate import generate  # noqa: PLC0415
    from engine.llm.package import load_model  # noqa: PLC0415
    from engine.llm.sampler import SamplingOptions  # noqa: PLC0415
    from engine.llm.tokenizer import LlmTokenizer  # noqa: PLC0415

    manifest = json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
    selftest = ((manifest.get("metadata") or {}).get("llm") or {}).get("selftest")
    model = load_model(directory)
    tokenizer = LlmTokenizer.from_directory(directory)
    if not selftest:
        return  # nothing recorded: loading is the check
    prompt, expected = selftest.get("prompt_tokens"), selftest.get("tokens")
    if not _token_list(prompt) or not _token_list(expected) or not expected:
        raise ActivationError("the LLM package's self-test record is malformed (prompt_tokens, tokens)")
    result = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=len(expected),
        options=SamplingOptions(temperature=0),
        stop_tokens=[],
    )
    if result.tokens != expected:
        first = next(
            (i for i, (a, b) in enumerate(zip(result.tokens, expected, strict=False)) if a != b), None
        )
        raise ActivationError(
            f"the LLM self-test generated {result.tokens} where conversion recorded {expected} "
            f"(first difference at token {first})"
        )


def _token_list(value: object) -> bool:
    return isinstance(value, list) and all(type(t) is int and t >= 0 for t in value)
