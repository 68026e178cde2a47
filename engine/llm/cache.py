"""The KV cache: keys and values of every layer, preallocated for the context length.

Shape per layer: [kv heads, context, head_dim], written in place as tokens arrive, so memory is
fixed when the cache is made (weights + this + a small constant) and a prompt past the context
length is refused before any work (``ContextLimitError`` says how far over).

Two storages (``kind``):
- ``"fp32"``: float32 keys and values;
- ``"int8"``: each (kv head, position) vector of head_dim values stored as int8 with one float32
  scale (symmetric, max|x| / 127): a quarter of the bytes (plus 4 bytes per head_dim values for
  the scales), so a device holds ~3.8x the context in the same memory, and decode reads ~3.8x
  fewer cache bytes per step.  Attention always reads what the cache holds (the quantized
  values, also for the block being prefilled), so a prefix reused from the cache gives what a
  fresh prefill of the same tokens gives.

The cache also records the token id at every position it holds: ``common_prefix`` tells a
generator how much of a new prompt is already there, ``truncate`` keeps that prefix (a shared
system prompt is then prefilled once).
"""

from __future__ import annotations

import numpy as np

from engine.llm.config import LlmConfig
from engine.llm.errors import ContextLimitError

KINDS = ("fp32", "int8")
_INT8_MAX = np.float32(127.0)


class KVCache:
    def __init__(self, config: LlmConfig, context: int | None = None, kind: str = "fp32") -> None:
        context = config.max_positions if context is None else int(context)
        if not 0 < context <= config.max_positions:
            raise ContextLimitError(
                f"context length {context} must be between 1 and the model's {config.max_positions} positions"
            )
        if kind not in KINDS:
            raise ValueError(f"KV cache kind {kind!r} is not one of {', '.join(KINDS)}")
        self.context, self.kind = context, kind
        shape = (config.num_layers, 2, config.num_kv_heads, context, config.head_dim)
        # keys and values in one array, so a step's int8 quantization is one pass over both
        self.data = np.zeros(shape, np.int8 if kind == "int8" else np.float32)
        self.keys, self.values = self.data[:, 0], self.data[:, 1]
        # int8 only: one scale per (layer, keys/values, kv head, position); empty for fp32
        self.scales = np.zeros(shape[:4] if kind == "int8" else (0, 2, 0, 0), np.float32)
        self.key_scales, self.value_scales = self.scales[:, 0], self.scales[:, 1]
        self.tokens = np.full(context, -1, np.int64)  # the id at each held position
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.scales.nbytes

    def reserve(self, count: int) -> int:
        """Check that ``count`` more tokens fit; return the position of the first."""
        if self.length + count > self.context:
            raise ContextLimitError(
                f"{self.length} cached + {count} new tokens exceed the context length {self.context} "
                f"by {self.length + count - self.context}; shorten the prompt or max_tokens"
            )
        return self.length

    def write(self, layer: int, start: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Store one layer's keys and values [m, kv heads, d] at positions start..start+m."""
        end = start + keys.shape[0]
        both = np.stack((keys, values)).transpose(0, 2, 1, 3)  # [2, kv heads, m, d]
        if self.kind == "fp32":
            self.data[layer, :, :, start:end] = both
        else:
            _quantize(both, self.data[layer, :, :, start:end], self.scales[layer, :, :, start:end])

    def read(self, layer: int, total: int) -> tuple[np.ndarray, np.ndarray]:
        """One layer's first ``total`` keys and values as float32 [kv heads, total, d] (views for
        fp32; dequantized copies for int8)."""
        keys, values = self.keys[layer, :, :total], self.values[layer, :, :total]
        if self.kind == "fp32":
            return keys, values
        return (
            keys.astype(np.float32) * self.key_scales[layer, :, :total, None],
            values.astype(np.float32) * self.value_scales[layer, :, :total, None],
        )

    def decode_inputs(self, layer: int) -> list[np.ndarray]:
        """The arrays decode attention reads for ``layer``: [keys, values], or for int8
        [keys, key scales, values, value scales] (engine/llm/attention.py)."""
        if self.kind == "fp32":
            return [self.keys[layer], self.values[layer]]
        return [self.keys[layer], self.key_scales[layer], self.values[layer], self.value_scales[layer]]

    def record(self, start: int, tokens: np.ndarray) -> None:
        """Note the ids now held at positions start.. (after every layer wrote them)."""
        self.tokens[start : start + tokens.size] = tokens
        self.length = start + tokens.size

    def common_prefix(self, tokens: list[int] | np.ndarray) -> int:
        """How many leading ``tokens`` the cache already holds, in order."""
        wanted = np.asarray(tokens, np.int64).reshape(-1)[: self.length]
        differs = np.flatnonzero(wanted != self.tokens[: wanted.size])
        return int(differs[0]) if differs.size else int(wanted.size)

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps a reusable prefix)."""
        self.length = max(0, min(int(length), self.length))
        self.tokens[self.length :] = -1

    def reset(self) -> None:
        self.truncate(0)


def _quantize(x: np.ndarray, q: np.ndarray, scales: np.ndarray) -> None:
    """x [..., d] float32 -> q int8 (same shape), scales [...]: per vector, symmetric.  Few numpy
    calls: at decode (one position) their overhead, not the arithmetic, is the cost."""
    largest = np.abs(x).max(axis=-1)
    scales[...] = largest / _INT8_MAX
    # an all-zero vector keeps scale 0 and quantizes to zeros (no division by zero); |x| *
    # 127 / largest rounds to at most 127, so no clip is needed
    inverse = _INT8_MAX / np.maximum(largest, np.float32(1e-30))
    q[...] = np.rint(x * inverse[..., None])
