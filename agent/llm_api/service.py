"""One loaded LLM package behind the API: requests run one at a time, at most ``queue_bound``
wait (the rest get 429), and the figures the agent reports (time to first token, prefill and
decode tok/s, tokens generated, prompt tokens reused from the cache, errors) accumulate between
two readings.

One KV cache is kept from request to request (engine.llm.generate.Generator): a prompt that
starts with the tokens of the last one (a shared system prompt, a chat's earlier turns) is
prefilled only past that prefix; the response's ``usage.prompt_tokens_details.cached_tokens``
says how many were reused (OpenAI's field for it).  The cache's storage is "fp32" or "int8"
(engine/llm/cache.py): the service's ``kv_cache`` argument (``serve-llm --kv-int8``, the agent's
``LlmHost``), else the ``FERRY_LLM_KV_CACHE`` environment variable (the device's choice wins over
the package's: it knows its memory), else the package's ``metadata.llm.kv_cache``, else fp32."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.inference import latency_histogram, percentile
from agent.llm_api.chat_request import ChatRequest
from agent.llm_api.errors import ApiError, ClientGone, invalid
from agent.llm_api.template import ChatTemplate, TemplateError

DEFAULT_MAX_TOKENS = 256
DEFAULT_QUEUE_BOUND = 8
KV_CACHE_ENV = "FERRY_LLM_KV_CACHE"
THREADS_ENV = "FERRY_LLM_THREADS"  # the cores a request may use (serve-llm: --threads)


def package_kind(directory: Path) -> str | None:
    """An unpacked package's ``metadata.kind`` ("llm", "llm-adapter"; None for other models)."""
    try:
        manifest = json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
        kind = (manifest.get("metadata") or {}).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def is_llm_package(directory: Path) -> bool:
    """Whether an unpacked package's manifest says ``kind: "llm"``."""
    return package_kind(directory) == "llm"


@dataclass
class Figures:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens found in the kept cache (not prefilled)
    tokens_generated: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    ttft: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ttft = sorted(self.ttft)
        return {
            **gate_figures(self.requests, self.errors, self.ttft),
            "llm_requests": self.requests,
            "llm_errors": self.errors,
            "llm_prompt_tokens": self.prompt_tokens,
            "llm_prefix_tokens_reused": self.reused_tokens,
            "llm_tokens_generated": self.tokens_generated,
            "llm_ttft_ms_p50": round(1000 * ttft[len(ttft) // 2], 3) if ttft else None,
            # the tokens actually prefilled: a reused prefix costs no prefill time
            "llm_prefill_tokens_per_second": _rate(
                self.prompt_tokens - self.reused_tokens, self.prefill_seconds
            ),
            "llm_decode_tokens_per_second": _rate(self.decode_steps, self.decode_seconds),
        }


def gate_figures(served: int, failed: int, latencies_s: list[float]) -> dict[str, Any]:
    """The fields a vision model's metrics record carries and the release gates read
    (deploy/gates.py): ``inferences`` counts served requests only, ``errors`` the requests that
    failed on the device's side, and the latency figures are of ``latencies_s`` (for a chat
    model its time to first token, which does not grow with the answer's length)."""
    latencies_ms = [1000 * s for s in latencies_s]
    p50, p95 = percentile(latencies_ms, 50), percentile(latencies_ms, 95)
    return {
        "inferences": served,
        "errors": failed,
        "latency_ms_p50": None if p50 is None else round(p50, 4),
        "latency_ms_p95": None if p95 is None else round(p95, 4),
        "latency_ms_histogram": latency_histogram(latencies_ms),
    }


def _rate(count: int, seconds: float) -> float | None:
    return round(count / seconds, 3) if seconds > 0 and count else None


@dataclass
class Completion:
    id: str
    created: int
    model: str
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # leading prompt tokens reused from the last request's cache
    time_to_first_token: float | None = None  # seconds; for the adapters' figures, not the body

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text},
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            },
        }


class LlmService:
    """An unpacked LLM package, loaded (weights memory-mapped), answering chat requests."""

    def __init__(
        self,
        directory: Path,
        name: str = "",
        version_id: str = "",
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        adapters: dict[str, Path] | None = None,
        kv_cache: str | None = None,
        threads: int | None = None,
    ) -> None:
        """``kv_cache``: "fp32" or "int8" (None: the package's, else the environment's; see above);
        ``threads``: the cores a request's kernels may use (engine/llm/threads.py; None:
        ``FERRY_LLM_THREADS``, else 1)."""
        from engine.llm import aot  # noqa: PLC0415
        from engine.llm.package import load_model  # noqa: PLC0415 - numpy only when an LLM runs
        from engine.llm.tokenizer import LlmTokenizer  # noqa: PLC0415

        # activation: with FERRY_LLM_AOT=1, compile the kernels ahead of time in a subprocess
        # (once per engine, numba and CPU) so serving never imports numba/LLVM (engine/llm/aot.py)
        aot.prepare()
        threads = _configured_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.threads = threads
        if threads > 1:
            from engine.llm import threads as llm_threads  # noqa: PLC0415

            llm_threads.prepare(threads)  # parallel kernels compiled now, not in a request
        self.directory = Path(directory)
        self.model = load_model(self.directory)
        self.tokenizer = LlmTokenizer.from_directory(self.directory)
        self.name = name or self.directory.name
        self.adapters: dict[str, Any] = {}
        for adapter_name, adapter_directory in (adapters or {}).items():
            self.add_adapter(adapter_name, adapter_directory)
        self.version_id = version_id
        self.context_length = self.model.config.max_positions
        config = self.tokenizer.config
        self.template = ChatTemplate(
            self.tokenizer.chat_template,
            {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token") if config.get(k)},
        )
        self.defaults = _read_json(self.directory / "generation.json")
        self.stop_tokens = self._stop_tokens(config)
        self._admitted = threading.BoundedSemaphore(queue_bound + 1)  # the running one + the waiting
        self._running = threading.Lock()
        self._figures_lock = threading.Lock()
        self._figures = Figures()
        self.generator: Any = None
        self.use_kv_cache(kv_cache or _configured_kv_cache(self.directory))

    def use_kv_cache(self, kind: str) -> None:
        """Keep the KV cache as ``kind`` ("fp32" or "int8"; ValueError otherwise), from the next
        request on (a new, empty cache: nothing is reused across the change)."""
        from engine.llm.cache import KINDS  # noqa: PLC0415
        from engine.llm.generate import Generator  # noqa: PLC0415

        if kind not in KINDS:
            raise ValueError(f"KV cache {kind!r} is not one of {', '.join(KINDS)}")
        with self._running:
            self.generator = Generator(self.model, self.tokenizer, kv_cache=kind, threads=self.threads)
        self.kv_cache = kind

    def _stop_tokens(self, config: dict[str, Any]) -> list[int]:
        stops = list(self.model.config.eos_token_ids)
        eos = config.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        found = self.tokenizer.token_id(eos) if isinstance(eos, str) else None
        if found is not None and found not in stops:
            stops.append(found)
        return stops

    def add_adapter(self, name: str, directory: Path) -> None:
        """Load a LoRA adapter package, served as model ``name``; one made for another base is
        refused (engine.llm.lora.AdapterError names both digests)."""
        from engine.llm.lora import base_digest, load_adapter  # noqa: PLC0415

        if name == self.name or name in self.adapters:
            raise ValueError(f"model name {name!r} is taken; give the adapter another name")
        manifest = _read_json(self.directory / "manifest.json")
        self.adapters[name] = load_adapter(directory, self.model.config, name, base_digest(manifest))

    def models(self) -> dict[str, Any]:
        created = int(self.directory.stat().st_mtime)
        entry = {"object": "model", "created": created, "owned_by": "ferry"}
        data = [{"id": self.name, **entry}]
        data += [{"id": name, **entry, "parent": self.name} for name in self.adapters]
        return {"object": "list", "data": data}

    def _adapter(self, model: str) -> Any:
        """The adapter a request's ``model`` names (None: the base), or 404."""
        if not model or model == self.name:
            return None
        if model in self.adapters:
            return self.adapters[model]
        served = ", ".join(repr(n) for n in [self.name, *self.adapters])
        raise ApiError(404, f"model {model!r} is not served here; try {served}", code="model_not_found")

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            text = self.template.render(messages)
        except TemplateError as exc:
            raise ApiError(500, str(exc), kind="server_error", code="template_error") from exc
        return self.tokenizer.encode(text) or [0]

    def complete(self, request: ChatRequest, on_text: Callable[[str], None] | None = None) -> Completion:
        """Run ``request`` when its turn comes (429 at once when the queue is full)."""
        try:
            return self._complete(request, on_text)
        except ClientGone:
            raise  # the client left: nothing failed here
        except ApiError as exc:
            # 4xx (bad request, unknown model, context too long, queue full) are the client's or
            # the load's, not the release's; a 5xx (the package's template fails) is an error
            if exc.status >= 500:
                self.count_error()
            raise
        except Exception:
            self.count_error()  # the engine failed: the server answers 500
            raise

    def _complete(self, request: ChatRequest, on_text: Callable[[str], None] | None) -> Completion:
        adapter = self._adapter(request.model)
        prompt = self.prompt_tokens(request.messages)
        room = self.context_length - len(prompt)
        if room < 1 or (request.max_tokens is not None and request.max_tokens > room):
            raise invalid(
                f"the prompt is {len(prompt)} tokens and {request.max_tokens or 1} more were asked for; "
                f"the model's context length is {self.context_length}",
                "context_length_exceeded",
            )
        max_tokens = request.max_tokens or min(
            int(self.defaults.get("max_new_tokens", DEFAULT_MAX_TOKENS)), room
        )
        options = self._options(request)
        if not self._admitted.acquire(blocking=False):
            raise ApiError(
                429,
                "the model is busy and its queue is full; retry shortly",
                kind="rate_limit_error",
                code="queue_full",
            )
        try:
            with self._running:
                return self._generate(request, prompt, max_tokens, options, on_text, adapter)
        finally:
            self._admitted.release()

    def _options(self, request: ChatRequest) -> Any:
        from engine.llm.sampler import SamplingOptions  # noqa: PLC0415

        chosen = dict(self.defaults)
        chosen.pop("max_new_tokens", None)
        for key in ("temperature", "top_p", "seed"):
            if getattr(request, key) is not None:
                chosen[key] = getattr(request, key)
        try:
            return SamplingOptions.from_dict(chosen)
        except (TypeError, ValueError) as exc:
            raise invalid(str(exc)) from exc

    def _generate(self, request, prompt, max_tokens, options, on_text, adapter=None) -> Completion:
        from engine.llm.errors import ContextLimitError  # noqa: PLC0415

        try:
            result = self.generator.generate(
                prompt,
                max_tokens=max_tokens,
                options=options,
                stop=request.stop,
                stop_tokens=self.stop_tokens,
                on_text=on_text,
                adapter=adapter,
            )
        except ContextLimitError as exc:
            raise invalid(str(exc), "context_length_exceeded") from exc
        with self._figures_lock:
            f = self._figures
            f.requests += 1
            f.prompt_tokens += result.prompt_tokens
            f.reused_tokens += result.reused_tokens
            f.tokens_generated += len(result.tokens)
            f.prefill_seconds += result.prefill_seconds
            f.decode_seconds += result.decode_seconds
            f.decode_steps += max(len(result.tokens) - 1, 0)
            f.ttft.append(result.time_to_first_token)
        return Completion(
            id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
            created=int(time.time()),
            model=request.model or self.name,
            text=result.text,
            finish_reason=result.finish_reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(result.tokens),
            cached_tokens=result.reused_tokens,
            time_to_first_token=result.time_to_first_token,
        )

    def count_error(self) -> None:
        """One request that failed on the device's side (the server answered 5xx)."""
        with self._figures_lock:
            self._figures.errors += 1

    def take_figures(self) -> dict[str, Any]:
        """The figures since the last call (for the agent's metrics record)."""
        with self._figures_lock:
            figures, self._figures = self._figures, Figures()
        return figures.summary()


def _configured_threads() -> int:
    """``FERRY_LLM_THREADS`` (a whole number of at least 1), else 1."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV} must be a whole number of at least 1, not {value!r}")
    return int(value)


def _configured_kv_cache(directory: Path) -> str:
    """``FERRY_LLM_KV_CACHE``, else the package's ``metadata.llm.kv_cache``, else "fp32"."""
    if os.environ.get(KV_CACHE_ENV):
        return os.environ[KV_CACHE_ENV]
    llm = (_read_json(directory / "manifest.json").get("metadata") or {}).get("llm")
    chosen = llm.get("kv_cache") if isinstance(llm, dict) else None
    return chosen if isinstance(chosen, str) and chosen else "fp32"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
