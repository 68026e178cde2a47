"""The LLM runtime's KV cache options, each beside its baseline in the same run: int8 keys and
values against the float32 cache (accuracy, memory, decode speed), and prefix reuse against a
fresh prefill (time to first token of a request sharing a system prompt).

    .venv/bin/python bench/llm_kv.py [--shape smollm2-135m] [--weights int8] [--tokens 512]
                                     [--decode 32] [--system 256] [--user 16] [--repeat 3]

The model: random weights with the shape's dimensions (tests/engine/llm/checkpoints.py's
initializer: 1/sqrt(fan-in) matrices, so attention is not flat), the matrices stored at
``--weights`` as a package would hold them.  The text: the bytes of README.md as token ids
(a random model has no tokenizer worth training; the ids only need a real text's repetitions).

- accuracy: the text teacher-forced, the first half prefilled in one block and the rest one
  decode step each, once over an fp32 cache and once over an int8 one (same weights): top-1
  agreement and KL(fp32 || int8) of the next-token distributions, at every position;
- memory: the cache's bytes for the model's full context;
- decode: ms per step after ``--tokens`` cached positions, fp32 and int8 alternating, best of
  ``--repeat``;
- prefix reuse: a request of ``--system`` + ``--user`` tokens after one that shared the system
  prompt: prefill seconds fresh (all tokens) and reused (truncate to the prefix, prefill the
  user's tokens: what engine.llm.generate.Generator does), alternating, best of ``--repeat``.
A random model's attention is not a trained one's (trained keys have outlier channels, which
per-vector int8 scales spread over the rest): read the accuracy figures as this model's.
The host is shared: compare ratios within one run.  Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

SHAPES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 2048},
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                     "max_position_embeddings": 8192, "rope_theta": 100000.0},
}  # fmt: skip


def build_model(shape: str, weights: str) -> object:
    """A random-weight model of ``shape`` with its matrices at ``weights``."""
    from engine.llm.checkpoint import Checkpoint  # noqa: PLC0415
    from engine.llm.config import parse_config  # noqa: PLC0415
    from engine.llm.model import LlmModel, weights_from_checkpoint  # noqa: PLC0415
    from tests.engine.llm.checkpoints import config_dict, random_tensors  # noqa: PLC0415

    hf = config_dict("llama", **SHAPES[shape], tie_word_embeddings=True)
    config = parse_config(hf)
    checkpoint = Checkpoint(directory=ROOT, config=config, tensors=random_tensors(hf, seed=0))
    return LlmModel(config, weights_from_checkpoint(checkpoint, weights, 32))


def text_ids(count: int, vocab: int) -> list[int]:
    data = (ROOT / "README.md").read_bytes()
    return [b % vocab for b in data[:count]]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def teacher_forced(model: object, ids: list[int], kind: str) -> np.ndarray:
    """Log-probabilities at every position: the first half prefilled, the rest decoded."""
    cache = model.new_cache(len(ids), kind)
    half = len(ids) // 2
    rows = [model.forward(ids[:half], cache, all_logits=True)]
    rows += [model.forward([t], cache)[None] for t in ids[half:]]
    return _log_softmax(np.concatenate(rows))


def accuracy(model: object, ids: list[int]) -> dict[str, float]:
    p, q = teacher_forced(model, ids, "fp32"), teacher_forced(model, ids, "int8")
    kl = np.sum(np.exp(p) * (p - q), axis=1)
    half = len(ids) // 2
    same = p.argmax(axis=1) == q.argmax(axis=1)
    return {
        "top1": float(same.mean()),
        "top1_decode": float(same[half:].mean()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
    }


def decode_timers(model: object, ids: list[int], steps: int, kind: str) -> tuple[Callable, Callable]:
    """Prefill ``ids`` once; (a whole decode step, its attention alone), each a call returning
    ms per step: ``steps`` tokens decoded after the prompt (the cache cut back to it first), and
    every layer's decode attention over the prompt's positions (what the cache's kind changes;
    the whole step is dominated by the GEMVs and noisier on a shared host)."""
    from engine.llm.weights import gemv_kernel  # noqa: PLC0415

    cache = model.new_cache(len(ids) + steps + 1, kind)
    first = int(np.argmax(model.forward(ids, cache)))
    kernel, c = gemv_kernel("LlmDecodeAttention"), model.config
    q = np.random.default_rng(0).standard_normal((c.num_heads, c.head_dim)).astype(np.float32)
    attrs = {"total": len(ids), "scale": 1.0 / np.sqrt(c.head_dim)}

    def step() -> float:
        cache.truncate(len(ids))
        token = first
        start = time.perf_counter()
        for _ in range(steps):
            token = int(np.argmax(model.forward([token], cache)))
        return (time.perf_counter() - start) / steps * 1e3

    def attention() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            for layer in range(c.num_layers):
                kernel([q, *cache.decode_inputs(layer)], attrs)
        return (time.perf_counter() - start) / steps * 1e3

    return step, attention


def prefill_seconds(model: object, system: list[int], user: list[int], reuse: bool) -> float:
    """The second request's prefill: fresh, or past the system prompt the first one left."""
    cache = model.new_cache(len(system) + len(user) + 1)
    if reuse:
        other = [(t + 1) % model.config.vocab_size for t in user]  # differs from the first user token
        model.forward(system + other, cache)  # the first request: the same system prompt
        cache.truncate(cache.common_prefix(system + user))
    start = time.perf_counter()
    model.forward((system + user)[cache.length :], cache)
    return time.perf_counter() - start


def best_alternating(runs: int, first: object, second: object) -> tuple[float, float]:
    """Best of ``runs`` of two measurements taken in turn (so host noise hits both alike)."""
    a, b = [], []
    for _ in range(runs):
        a.append(first())
        b.append(second())
    return min(a), min(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--weights", default="int8", choices=("fp32", "int8", "int4"))
    parser.add_argument("--tokens", type=int, default=512, help="accuracy text and decode context length")
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--long", type=int, default=2048, help="a second decode context length")
    parser.add_argument("--system", type=int, default=256)
    parser.add_argument("--user", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    from engine import jit  # noqa: PLC0415

    with threadpool_limits(args.threads), jit.thread_limit(args.threads):
        run(args)


def run(args: argparse.Namespace) -> None:
    from engine.llm.cache import KVCache  # noqa: PLC0415

    model = build_model(args.shape, args.weights)
    config = model.config
    ids = text_ids(args.tokens, config.vocab_size)
    figures = accuracy(model, ids)
    full = {kind: KVCache(config, None, kind).nbytes for kind in ("fp32", "int8")}
    decode, attention = {}, {}  # cached positions -> (fp32 ms, int8 ms)
    for length in (args.tokens, args.long):
        context = text_ids(length, config.vocab_size)
        (fp32_step, fp32_attention), (int8_step, int8_attention) = (
            decode_timers(model, context, args.decode, kind) for kind in ("fp32", "int8")
        )
        decode[length] = best_alternating(args.repeat, fp32_step, int8_step)
        attention[length] = best_alternating(args.repeat, fp32_attention, int8_attention)
    system = text_ids(args.system + args.user, config.vocab_size)
    system, user = system[: args.system], system[args.system :]
    fresh, reused = best_alternating(
        args.repeat,
        lambda: prefill_seconds(model, system, user, reuse=False),
        lambda: prefill_seconds(model, system, user, reuse=True),
    )
    print(f"model: {args.shape} (random weights, matrices {args.weights}), {args.threads} thread(s)")
    mib = {kind: f"{n / 2**20:.1f} MiB" for kind, n in full.items()}
    table(
        ("measure", "fp32 KV", "int8 KV", "ratio"),
        [
            (f"cache, full context ({config.max_positions})", mib["fp32"], mib["int8"],
             f"{full['fp32'] / full['int8']:.2f}x smaller"),
            *((f"decode ms/step at {n} cached", f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x faster")
              for n, (a, b) in decode.items()),
            *((f"its attention (all layers) at {n} cached", f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x faster")
              for n, (a, b) in attention.items()),
            (f"top-1 agreement, {args.tokens} positions (decoded half)", "1",
             f"{figures['top1']:.4f} ({figures['top1_decode']:.4f})", ""),
            ("KL(fp32 || int8) mean / max, nats", "0",
             f"{figures['mean_kl']:.2e} / {figures['max_kl']:.2e}", ""),
        ],
    )  # fmt: skip
    table(
        (f"prefix reuse ({args.system} system + {args.user} user tokens)", "fresh", "reused", "ratio"),
        [
            ("prefill ms", f"{fresh * 1e3:.1f}", f"{reused * 1e3:.1f}", f"{fresh / reused:.1f}x"),
            ("tokens prefilled", str(args.system + args.user), str(args.user), ""),
        ],
    )


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    print("\n| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
