"""The generation loop: prefill the prompt, then sample and decode one token at a time, with
stop tokens, stop strings and streaming (text handed to a callback as it becomes final).

Prefix reuse: a ``Generator`` keeps one KV cache from request to request.  The cache records
the token at each position it holds (the last prompt and the reply generated after it), so a
new prompt that starts with those tokens (a shared system prompt; a chat's earlier turns) is
truncated to the common prefix and only the rest is prefilled.  Attention reads the same cached
keys and values either way, so the logits are those of a fresh prefill up to the float rounding
of a different block split (tests/engine/llm/test_kv_cache.py measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.llm.cache import KVCache
from engine.llm.errors import ContextLimitError
from engine.llm.lora import LoraAdapter
from engine.llm.model import LlmModel
from engine.llm.sampler import Sampler, SamplingOptions
from engine.llm.threads import running_on
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
    reused_tokens: int = 0  # leading prompt tokens found in the cache, not prefilled again

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens

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
    reuse_prefix: bool = False,
) -> Generation:
    """Generate up to ``max_tokens`` after ``prompt`` (token ids).  ``on_text`` receives the text
    as it is produced, never any part of a stop string, and the pieces join to ``text``.
    ``adapter``: a LoRA adapter applied to every step (engine/llm/lora.py).  ``cache``: appended
    to as it is, or with ``reuse_prefix`` cut to the longest prefix of ``prompt`` it holds (the
    caller keeps one cache per adapter: ``Generator`` does)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be at least 1")
    if not prompt:
        raise ValueError("the prompt needs at least one token")
    cache = cache if cache is not None else model.new_cache()
    if reuse_prefix:
        _check_fits(cache, len(prompt), max_tokens)
    reused = _keep_prefix(cache, prompt) if reuse_prefix else 0
    cache.reserve(len(prompt) - reused + max_tokens - 1)  # refuse before any work, not midway
    sampler = Sampler(options)
    stops = set(model.config.eos_token_ids if stop_tokens is None else stop_tokens)
    start = time.perf_counter()
    logits = model.forward(prompt[reused:], cache, adapter=adapter)
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
        reused_tokens=reused,
    )


def _check_fits(cache: KVCache, prompt: int, max_tokens: int) -> None:
    """The request's own size against the context (what the cache holds is replaceable); the
    last token generated is never stored, so it needs no position."""
    needed = prompt + max_tokens - 1
    if needed > cache.context:
        raise ContextLimitError(
            f"{prompt} prompt tokens and max_tokens={max_tokens} need {needed} of the context length's "
            f"{cache.context} positions; shorten the prompt or max_tokens"
        )


def _keep_prefix(cache: KVCache, prompt: Sequence[int]) -> int:
    """Truncate ``cache`` to the prompt's prefix it holds, leaving at least one token to prefill
    (the logits of the prompt's last position are needed); the tokens kept."""
    kept = min(cache.common_prefix(list(prompt)), len(prompt) - 1)
    cache.truncate(kept)
    return kept


class Generator:
    """Generation request after request over one kept KV cache (prefix reuse, see above).
    Not thread-safe: one request at a time (the chat service's lock)."""

    def __init__(
        self,
        model: LlmModel,
        tokenizer: LlmTokenizer,
        context: int | None = None,
        kv_cache: str = "fp32",
        threads: int = 1,
    ) -> None:
        """``threads``: what the kernels may use (engine/llm/threads.py)."""
        self.model, self.tokenizer = model, tokenizer
        self.cache = model.new_cache(context, kv_cache)
        self.threads = threads
        self._adapter: LoraAdapter | None = None

    def generate(
        self, prompt: list[int], *, adapter: LoraAdapter | None = None, **options: Any
    ) -> Generation:
        """``generate`` with this generator's cache; ``options`` as ``generate``'s keywords."""
        if adapter is not self._adapter:  # another adapter's keys and values are not this one's
            self.cache.reset()
            self._adapter = adapter
        model, tokenizer, cache = self.model, self.tokenizer, self.cache
        with running_on(self.threads):
            return generate(
                model, tokenizer, prompt, cache=cache, adapter=adapter, reuse_prefix=True, **options
            )


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    found = [text.find(s) for s in stop if s and s in text]
    return min(found) if found else None
