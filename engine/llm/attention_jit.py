"""Decode's attention as one JIT kernel (numba): one new query per head against the cache.

A decode step's attention in numpy is a dozen small array operations per layer (a grouped
matmul, the scale, max, exp, sum, divide, a second matmul, transposes) whose call overhead,
not arithmetic, is the cost at a few hundred cached positions: ~20% of a SmolLM2-135M decode
step measured with cProfile.  Here it is one call per layer: per kv head, the scores of the
query heads sharing it against its keys (each key read once for the group), a softmax each,
and the weighted sums of the values (each value read once): SmolLM2-135M's 30 layers at 290
positions took 1.41-1.44 ms CPU per query head, 0.98-1.07 ms blocked by kv head.  The numpy twin
is ``decode_attention_numpy`` (the runtime's own m == 1 path, engine/llm/model.py).

An int8 cache (engine/llm/cache.py) has its own kernel: the int8 keys and values are read as
they are stored and each position's scale applied once per dot product (keys) or weight
(values), so no dequantized copy of the cache is made per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from engine import jit

_F32 = types.float32
_CACHE = jit.array(_F32, 3, "C", readonly=True)
_SIGNATURE = types.void(
    jit.array(_F32, 2, "C", readonly=True), _CACHE, _CACHE, types.int64, _F32, jit.array(_F32, 1, "C")
)
_SCALES = jit.array(_F32, 2, "C", readonly=True)
_CACHE8 = jit.array(types.int8, 3, "C", readonly=True)
_SIGNATURE8 = types.void(
    jit.array(_F32, 2, "C", readonly=True),
    _CACHE8,
    _SCALES,
    _CACHE8,
    _SCALES,
    types.int64,
    _F32,
    jit.array(_F32, 1, "C"),
)
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _float_bits(typingctx, bits):  # noqa: ANN001, ANN202, ARG001
    """The float32 whose bits are the int32 ``bits``."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(inline="always", cache=True)
def exp(x):  # noqa: ANN001, ANN202
    """e^x in float32 within ~2 ulp (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-6
    polynomial for e^r, times 2^n built from its bits), x clamped to [-87, 88].  numba's np.exp
    calls libm once per value (~7 ns here, never vectorised); this is straight arithmetic that
    LLVM vectorises: decode's softmaxes and SwiGLU spent ~1 ms of a ~10 ms step in expf."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * _float_bits((np.int32(n) + np.int32(127)) << np.int32(23))


@jit.njit([types.void(jit.array(_F32, 1, "C"), jit.array(_F32, 1, "C", readonly=True))], fastmath=_FAST)
def _softmax_into(row, factors):  # noqa: ANN001, ANN202
    """row <- softmax(row) * factors[:len(row)], in place."""
    largest = row[0]
    for t in range(1, row.size):
        largest = max(largest, row[t])
    norm = np.float32(0.0)
    for t in range(row.size):
        e = exp(row[t] - largest)
        row[t] = e
        norm += e
    inverse = np.float32(1.0) / norm
    for t in range(row.size):
        row[t] *= inverse * factors[t]


@jit.njit([_SIGNATURE], fastmath=_FAST)
def _decode_attention(q, keys, values, total, scale, out):  # noqa: ANN001, ANN202
    """q [H, d]; keys/values [KV, context, d] (the first ``total`` positions are used); out [H*d].
    Blocked by kv head as the int8 kernel is: each cached key and value is read once for the
    query heads sharing it."""
    heads, d = q.shape
    group = heads // keys.shape[0]
    scores = np.empty((group, total), np.float32)
    ones = np.ones(total, np.float32)
    for g in range(keys.shape[0]):
        for t in range(total):
            key = keys[g, t]
            for j in range(group):
                query = q[g * group + j]
                s = np.float32(0.0)
                for i in range(d):
                    s += query[i] * key[i]
                scores[j, t] = s * scale
        for j in range(group):
            _softmax_into(scores[j], ones)
            out[(g * group + j) * d : (g * group + j + 1) * d] = 0.0
        for t in range(total):
            value = values[g, t]
            for j in range(group):
                weight = scores[j, t]
                o = out[(g * group + j) * d : (g * group + j + 1) * d]
                for i in range(d):
                    o[i] += weight * value[i]


@jit.njit([_SIGNATURE8], fastmath=_FAST)
def _decode_attention_int8(q, keys, key_scales, values, value_scales, total, scale, out):  # noqa: ANN001, ANN202
    """As ``_decode_attention`` over an int8 cache: keys/values [KV, context, d] int8, their
    scales [KV, context] (a cached value is its int8 times its scale).  Blocked by kv head:
    each cached key and value is read once for the query heads sharing it (~1.3-1.7x faster
    than per query head at 2048 positions, measured with SmolLM2-135M's shapes)."""
    heads, d = q.shape
    group = heads // keys.shape[0]
    scores = np.empty((group, total), np.float32)
    for g in range(keys.shape[0]):
        for t in range(total):
            key = keys[g, t]
            factor = key_scales[g, t] * scale
            for j in range(group):
                query = q[g * group + j]
                s = np.float32(0.0)
                for i in range(d):
                    s += query[i] * np.float32(key[i])
                scores[j, t] = s * factor
        for j in range(group):
            _softmax_into(scores[j], value_scales[g])  # the values' scales folded into the weights
            out[(g * group + j) * d : (g * group + j + 1) * d] = 0.0
        for t in range(total):
            value = values[g, t]
            for j in range(group):
                weight = scores[j, t]
                o = out[(g * group + j) * d : (g * group + j + 1) * d]
                for i in range(d):
                    o[i] += weight * np.float32(value[i])


@jit.njit([types.void(jit.array(_F32, 3, "C"), types.int64, types.int64)], fastmath=_FAST)
def causal_softmax(scores, m, start):  # noqa: ANN001, ANN202
    """Prefill's softmax in place: scores [KV, group * m, total] of m queries at positions
    start.. (row r is query r % m); each row's softmax over the keys its query sees (positions
    0..start + r % m), the later ones set to 0.  One pass per row where numpy's masked softmax
    was six over the whole block (a mask, max, subtract, exp, sum, divide): SmolLM2-135M's
    shapes at 256 tokens, 0.40 against 1.81 ms a layer on an AMD EPYC."""
    ones = np.ones(scores.shape[2], np.float32)
    for h in range(scores.shape[0]):
        for r in range(scores.shape[1]):
            row = scores[h, r]
            visible = min(start + r % m + 1, row.size)
            _softmax_into(row[:visible], ones)
            row[visible:] = 0.0


def decode_attention_jit(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: q [H, d], keys [KV, context, d], values [KV, context, d] float32, or
    q, keys, key scales, values, value scales for an int8 cache; attrs: total, scale -> [H * d]."""
    q = np.ascontiguousarray(inputs[0], np.float32)
    out = np.empty(q.size, np.float32)
    total, scale = int(attrs["total"]), np.float32(attrs["scale"])
    if len(inputs) == 3:
        _decode_attention(q, inputs[1], inputs[2], total, scale, out)
    else:
        _decode_attention_int8(q, *inputs[1:], total, scale, out)
    return [out]


decode_attention_jit.jit = True  # type: ignore[attr-defined]


def _attention(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Any]:
    return [decode_attention_jit]


CANDIDATES = {"LlmDecodeAttention": _attention}
