"""The KV cache: keys and values of every layer, preallocated for the context length.

Shape per layer: [kv heads, context, head_dim] float32, written in place as tokens arrive, so
memory is fixed when the cache is made (weights + this + a small constant) and a prompt past
the context length is refused before any work (``ContextLimitError`` says how far over).
``truncate`` keeps a prefix (a shared system prompt is then prefilled once).
"""

from __future__ import annotations

import numpy as np

from engine.llm.config import LlmConfig
from engine.llm.errors import ContextLimitError


class KVCache:
    def __init__(self, config: LlmConfig, context: int | None = None) -> None:
        context = config.max_positions if context is None else int(context)
        if not 0 < context <= config.max_positions:
            raise ContextLimitError(
                f"context length {context} must be between 1 and the model's {config.max_positions} positions"
            )
        self.context = context
        shape = (config.num_layers, config.num_kv_heads, context, config.head_dim)
        self.keys = np.zeros(shape, np.float32)
        self.values = np.zeros(shape, np.float32)
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def reserve(self, count: int) -> int:
        """Check that ``count`` more tokens fit; return the position of the first."""
        if self.length + count > self.context:
            raise ContextLimitError(
                f"{self.length} cached + {count} new tokens exceed the context length {self.context} "
                f"by {self.length + count - self.context}; shorten the prompt or max_tokens"
            )
        return self.length

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps a reusable prefix)."""
        self.length = max(0, min(int(length), self.length))

    def reset(self) -> None:
        self.length = 0
