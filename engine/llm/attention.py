"""Decode's attention (one new query per head over the KV cache): the numpy kernel, the JIT
one's twin (engine/llm/attention_jit.py), both behind the kernel layer's ``LlmDecodeAttention``;
and prefill's causal softmax, twin of attention_jit's ``causal_softmax``.

The inputs say the cache's storage (engine/llm/cache.py): [q, keys, values] for float32, or
[q, keys, key scales, values, value scales] for int8 (one scale per kv head and position).  One
op for both keeps the kernel layer's registry as it is; the arrays' count picks the path."""

from __future__ import annotations

from typing import Any

import numpy as np


def decode_attention_numpy(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: q [H, d], keys [KV, context, d], values [KV, context, d] float32 (or the int8
    form above); attrs: total, scale -> [H * d]: softmax(q k^T * scale) v over the first
    ``total`` positions, query head h reading kv head h // (H / KV)."""
    total, scale = int(attrs["total"]), np.float32(attrs["scale"])
    q, keys, values = _float_cache(inputs, total)
    heads, d = q.shape
    kv = keys.shape[0]
    grouped = q.reshape(kv, heads // kv, d)
    scores = np.matmul(grouped, keys.transpose(0, 2, 1)) * scale
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return [np.matmul(scores, values).reshape(heads * d)]


def _float_cache(inputs: list[np.ndarray], total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q and the first ``total`` keys and values as float32 (int8 ones dequantized)."""
    if len(inputs) == 3:
        q, keys, values = inputs
        return q, keys[:, :total], values[:, :total]
    q, keys, key_scales, values, value_scales = inputs
    return (
        q,
        keys[:, :total].astype(np.float32) * key_scales[:, :total, None],
        values[:, :total].astype(np.float32) * value_scales[:, :total, None],
    )


def causal_softmax_numpy(scores: np.ndarray, m: int, start: int) -> None:
    """Softmax in place of scores [KV, group * m, total] for m queries at positions start..
    (row r is query r % m), each over the keys its query sees (0..start + r % m); the later
    keys get 0."""
    heads, rows, total = scores.shape
    visible = np.arange(total)[None, :] <= (start + np.arange(m))[:, None]  # [m, total]
    view = scores.reshape(heads, rows // m, m, total)
    view[...] = np.where(visible, view, np.float32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
