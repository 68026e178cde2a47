"""Decode's attention (one new query per head over the KV cache): the numpy kernel, the JIT
one's twin (engine/llm/attention_jit.py), both behind the kernel layer's ``LlmDecodeAttention``."""

from __future__ import annotations

from typing import Any

import numpy as np


def decode_attention_numpy(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: q [H, d], keys [KV, context, d], values [KV, context, d] float32; attrs: total,
    scale -> [H * d]: softmax(q k^T * scale) v over the first ``total`` positions, query head h
    reading kv head h // (H / KV)."""
    q, keys, values = inputs
    total, scale = int(attrs["total"]), np.float32(attrs["scale"])
    heads, d = q.shape
    kv = keys.shape[0]
    grouped = q.reshape(kv, heads // kv, d)
    scores = np.matmul(grouped, keys[:, :total].transpose(0, 2, 1)) * scale
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return [np.matmul(scores, values[:, :total]).reshape(heads * d)]
