"""The accuracy report of a converted LLM against its float32 self, over a text.

Per position t of the text's tokens: the fp32 and the converted model's next-token
distributions p and q.  Reported: top-1 agreement (argmax p == argmax q), mean KL(p || q) in
nats, and each model's perplexity on the text (exp of the mean negative log-likelihood of the
actual next token).  Both models see the same tokens (teacher forcing), in one prefill.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.llm.model import LlmModel


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(reference: LlmModel, converted: LlmModel, tokens: list[int]) -> dict[str, Any]:
    """The report's figures over ``tokens`` (at least two)."""
    if len(tokens) < 2:
        raise ValueError("the accuracy text needs at least two tokens")
    context = min(reference.config.max_positions, len(tokens))
    tokens = tokens[:context]
    p = log_softmax(reference.forward(tokens, reference.new_cache(context), all_logits=True))[:-1]
    q = (
        p
        if converted is reference
        else log_softmax(converted.forward(tokens, converted.new_cache(context), True))[:-1]
    )
    following = np.asarray(tokens[1:])
    rows = np.arange(following.size)
    return {
        "tokens": len(tokens),
        "top1_agreement": float(np.mean(p.argmax(axis=1) == q.argmax(axis=1))),
        "mean_kl": float(np.mean(np.sum(np.exp(p) * (p - q), axis=1))),
        "perplexity": float(np.exp(-q[rows, following].mean())),
        "fp32_perplexity": float(np.exp(-p[rows, following].mean())),
    }
