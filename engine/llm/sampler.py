"""Ferry's sampler: greedy, temperature, top-k, top-p, min-p and a repetition penalty, seeded.

Order (as transformers' logits processors apply them): repetition penalty on the raw logits,
then temperature, then the top-k, top-p and min-p filters on the resulting distribution, then
one draw.  ``temperature == 0`` is greedy (argmax after the penalty).  The same seed and the
same logits give the same tokens (a ``numpy.random.Generator`` owned by the sampler).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, "a number >= 0"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "an integer >= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("min_p", 0 <= self.min_p < 1, "in [0, 1)"),
            (
                "repetition_penalty",
                math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
                "> 0",
            ),
        ]
        for name, ok, wanted in checks:
            if not ok:
                raise ValueError(f"sampling option {name}={getattr(self, name)!r} must be {wanted}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingOptions:
        """The known keys of a dict (a package's generation defaults, a request)."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if data.get(k) is not None}
        return cls(**known)


class Sampler:
    def __init__(self, options: SamplingOptions | None = None) -> None:
        self.options = options or SamplingOptions()
        self._rng = np.random.default_rng(self.options.seed)

    def probabilities(self, logits: np.ndarray, previous: list[int] | np.ndarray = ()) -> np.ndarray:
        """The distribution the next draw uses (float64, zeros where filtered; one-hot when greedy)."""
        o = self.options
        scores = np.asarray(logits, dtype=np.float64).copy()
        if o.repetition_penalty != 1.0 and len(previous):
            seen = np.unique(np.asarray(previous, dtype=np.int64))
            values = scores[seen]
            scores[seen] = np.where(values > 0, values / o.repetition_penalty, values * o.repetition_penalty)
        if o.temperature == 0:
            probs = np.zeros_like(scores)
            probs[int(np.argmax(scores))] = 1.0
            return probs
        scores /= o.temperature
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        keep = np.ones(probs.shape, bool)
        if 0 < o.top_k < probs.size:
            keep &= probs >= np.partition(probs, -o.top_k)[-o.top_k]
        if o.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            before = np.cumsum(probs[order]) - probs[order]  # mass of the tokens ranked above
            nucleus = np.zeros(probs.shape, bool)
            nucleus[order[before < o.top_p]] = True
            keep &= nucleus
        if o.min_p > 0:
            keep &= probs >= o.min_p * probs.max()
        probs = np.where(keep, probs, 0.0)
        return probs / probs.sum()

    def sample(self, logits: np.ndarray, previous: list[int] | np.ndarray = ()) -> int:
        probs = self.probabilities(logits, previous)
        if self.options.temperature == 0:
            return int(np.argmax(probs))
        # inverse CDF: one uniform draw; side="right" never lands on a zero-probability token
        cdf = np.cumsum(probs)
        return int(min(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"), probs.size - 1))
