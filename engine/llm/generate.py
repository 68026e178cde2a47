"""The generation loop: prefill the prompt, then sample and decode one token at a time, with
stop tokens, stop strings and streaming (text handed to a callback as it becomes final)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.llm.cache import KVCache
from engine.llm.lora import LoraAdapter
from engine.llm.model import LlmModel
from engine.llm.sampler import Sampler, SamplingOptions
from engine.llm.tokenizer import LlmTokenizer


@dataclass
class Generation:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (a stop token or string) or "length"
    prompt_tokens: int
    time_to_first_token: float
    prefill_seconds: float
    decode_seconds: float
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


def generate(
    model: LlmModel,
    tokenizer: LlmTokenizer,
    prompt: list[int],
    *,
    max_tokens: int = 128,
    options: SamplingOptions | None = None,
    stop: Sequence[str] = (),
    stop_tokens: Sequence[int] | None = None,
    on_text: Callable[[str], None] | None = None,
    cache: KVCache | None = None,
    adapter: LoraAdapter | None = None,
) -> Generation:
    """Generate up to ``max_tokens`` after ``prompt`` (token ids).  ``on_text`` receives the text
    as it is produced, never any part of a stop string, and the pieces join to ``text``.
    ``adapter``: a LoRA adapter applied to every step (engine/llm/lora.py)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be at least 1")
    cache = cache if cache is not None else model.new_cache()
    cache.reserve(len(prompt) + max_tokens - 1)  # refuse before any work, not midway
    sampler = Sampler(options)
    stops = set(model.config.eos_token_ids if stop_tokens is None else stop_tokens)
    start = time.perf_counter()
    logits = model.forward(prompt, cache, adapter=adapter)
    prefill = time.perf_counter() - start
    tokens: list[int] = []
    text, sent, reason = "", 0, "length"
    hold = max((len(s) for s in stop), default=1) - 1  # a stop string may still be completing
    first = 0.0
    while len(tokens) < max_tokens:
        token = sampler.sample(logits, list(prompt) + tokens)
        if not tokens:
            first = time.perf_counter() - start
        if token in stops:
            reason = "stop"
            break
        tokens.append(token)
        text = tokenizer.decode(tokens)
        cut = _first_stop(text, stop)
        if cut is not None:
            text, reason = text[:cut], "stop"
            break
        ready = len(text) - hold if not text.endswith("\ufffd") else len(text) - hold - 1
        if on_text is not None and ready > sent:
            on_text(text[sent:ready])
            sent = ready
        if len(tokens) < max_tokens:
            logits = model.forward([token], cache, adapter=adapter)
    if on_text is not None and len(text) > sent:
        on_text(text[sent:])
    decode = time.perf_counter() - start - prefill
    return Generation(
        text=text,
        tokens=tokens,
        finish_reason=reason,
        prompt_tokens=len(prompt),
        time_to_first_token=first,
        prefill_seconds=prefill,
        decode_seconds=decode,
    )


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    found = [text.find(s) for s in stop if s and s in text]
    return min(found) if found else None
