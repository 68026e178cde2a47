"""A decode step's non-GEMV work per layer as three JIT kernels (numba), for engine/llm/model.py.

In numpy a SmolLM2-135M decode step spent ~4.5 ms of ~14 outside its GEMVs (1 thread): RMSNorm,
RoPE, the cache write, SwiGLU and residual adds are ~25 small array operations per layer whose
call overhead and temporaries, not arithmetic, are the cost.  Here a layer is
    qkv GEMV -> ``attend`` (bias, RoPE on q and k, cache write, attention)
    -> o GEMV -> ``add_norm`` (x += o + bias; b = RMSNorm(x))
    -> gate/up GEMV -> ``swiglu`` -> down GEMV -> ``add_norm`` (x += down; the next norm)
with every buffer preallocated once per model (model.py's ``DecodeBuffers``); the last
``add_norm`` applies the next layer's input norm, or after the last layer the final norm.
The numpy twin is model.py's ``_step`` (FERRY_JIT=0, prefill, LoRA adapters); the int8 cache
write rounds exactly as cache.py's ``_quantize`` (no fastmath there).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types

from engine import jit
from engine.llm.attention_jit import _decode_attention, _decode_attention_int8, exp
from engine.llm.dot_jit import SUB, gemv_dot, gemv_dot8
from engine.llm.gemv_jit import _int4_grouped_q8, _int8_serial

_F32, _I64 = types.float32, types.int64
_IN = jit.array(_F32, 1, "C", readonly=True)
_OUT = jit.array(_F32, 1, "C")
_ROWS_IN, _ROWS_OUT = jit.array(_F32, 2, "C", readonly=True), jit.array(_F32, 2, "C")
_CACHE = jit.array(_F32, 3, "C")
_CACHE8 = jit.array(types.int8, 3, "C")
_SCALES = jit.array(_F32, 2, "C")
_ROPE = (_IN, _IN, _IN, _IN, _I64)  # qkv, bias (empty: none), cos, sin [d/2] at the position, kv heads
_INT8_MAX = np.float32(127.0)
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@jit.njit([types.void(_OUT, _IN, _IN, _IN, types.float64, _OUT)])
def add_norm(x, delta, bias, weight, eps, out):  # noqa: ANN001, ANN202
    """x += delta (+ bias, when not empty), in place; out = RMSNorm(x) * weight.  An empty
    ``delta`` only normalizes (the first layer's input)."""
    total = 0.0  # float64: 576 squares summed without the order mattering
    for i in range(x.size):
        if delta.size:
            x[i] += delta[i] + (bias[i] if bias.size else np.float32(0.0))
        total += np.float64(x[i]) * x[i]
    inverse = np.float32(1.0 / np.sqrt(np.float32(total / x.size) + eps))
    for i in range(x.size):
        out[i] = x[i] * inverse * weight[i]


# error_model="numpy": a float division by zero gives inf, as numpy's, not a raise whose check
# per element kept LLVM from vectorizing the loop (4x slower: 6.2 against 1.5 us for 1536 values)
@jit.njit([types.void(_IN, _OUT)], fastmath=_FAST, error_model="numpy")
def swiglu(gate_up, out):  # noqa: ANN001, ANN202
    """gate_up = [gate, up] -> out = silu(gate) * up."""
    n = out.size
    for i in range(n):
        g = gate_up[i]
        out[i] = g / (np.float32(1.0) + exp(-g)) * gate_up[n + i]


@jit.njit([types.void(_ROWS_IN, _ROWS_OUT)], fastmath=_FAST, error_model="numpy")
def swiglu_rows(gate_up, out):  # noqa: ANN001, ANN202
    """Prefill's ``swiglu``, row by row: gate_up [m, 2n] = [gate, up] -> out [m, n].  One pass
    where numpy's silu(gate) * up made five over the block."""
    for r in range(out.shape[0]):
        swiglu(gate_up[r], out[r])


@numba.njit(inline="always", cache=True)
def _rotate(qkv, bias, cos, sin, offset, out):  # noqa: ANN001, ANN202
    """out[0:d] = RoPE(qkv[offset:offset+d] + bias) (rotate-half form, transformers')."""
    half = cos.size
    for i in range(half):
        x1, x2 = qkv[offset + i], qkv[offset + half + i]
        if bias.size:
            x1 += bias[offset + i]
            x2 += bias[offset + half + i]
        out[i] = x1 * cos[i] - x2 * sin[i]
        out[half + i] = x2 * cos[i] + x1 * sin[i]


@numba.njit(inline="always", cache=True)
def _rope_q(qkv, bias, cos, sin, q):  # noqa: ANN001, ANN202
    d = q.shape[1]
    for h in range(q.shape[0]):
        _rotate(qkv, bias, cos, sin, h * d, q[h])


@numba.njit(inline="always", cache=True)
def _value(qkv, bias, index):  # noqa: ANN001, ANN202
    return qkv[index] + bias[index] if bias.size else qkv[index]


@jit.njit([types.void(*_ROPE, _I64, _F32, jit.array(_F32, 2, "C"), _CACHE, _CACHE, _OUT)])
def attend(qkv, bias, cos, sin, kv_heads, position, scale, q, keys, values, out):  # noqa: ANN001, ANN202
    """One decode position over a float32 cache: q [H, d] and the new key get RoPE, the key and
    value are written at ``position`` of keys/values [KV, context, d], and out [H * d] is the
    attention over positions 0..position (attention_jit's kernel)."""
    heads, d = q.shape
    _rope_q(qkv, bias, cos, sin, q)
    base = heads * d
    for g in range(kv_heads):
        _rotate(qkv, bias, cos, sin, base + g * d, keys[g, position])
        start = base + kv_heads * d + g * d
        row = values[g, position]
        for i in range(d):
            row[i] = _value(qkv, bias, start + i)
    _decode_attention(q, keys, values, position + 1, scale, out)


@numba.njit(inline="always", cache=True)
def _quantize_into(x, q, scales, g, position):  # noqa: ANN001, ANN202
    """cache.py's ``_quantize`` for one vector: scale = max|x| / 127, q = rint(x * 127 / max)."""
    largest = np.float32(0.0)
    for i in range(x.size):
        largest = max(largest, abs(x[i]))
    scales[g, position] = largest / _INT8_MAX
    inverse = _INT8_MAX / max(largest, np.float32(1e-30))
    row = q[g, position]
    for i in range(x.size):
        row[i] = np.int8(np.rint(x[i] * inverse))


_ATTEND8 = types.void(*_ROPE, _I64, _F32, jit.array(_F32, 2, "C"), _CACHE8, _SCALES, _CACHE8, _SCALES, _OUT)


@jit.njit([_ATTEND8])
def attend_int8(
    qkv, bias, cos, sin, kv_heads, position, scale, q, keys, key_scales, values, value_scales, out
):  # noqa: ANN001, ANN202, E501
    """``attend`` over an int8 cache: the new key and value rounded per vector as cache.py does."""
    heads, d = q.shape
    _rope_q(qkv, bias, cos, sin, q)
    vector = np.empty(d, np.float32)
    base = heads * d
    for g in range(kv_heads):
        _rotate(qkv, bias, cos, sin, base + g * d, vector)
        _quantize_into(vector, keys, key_scales, g, position)
        start = base + kv_heads * d + g * d
        for i in range(d):
            vector[i] = _value(qkv, bias, start + i)
        _quantize_into(vector, values, value_scales, g, position)
    _decode_attention_int8(q, keys, key_scales, values, value_scales, position + 1, scale, out)


# ---- a whole layer in one call, where its four matrices are the converter's int4 (int8
# activations, float16 scales: in the dot layout, dot_jit's ``gemv_dot``, or row-grouped,
# gemv_jit's ``_int4_grouped_q8``) or int8 per-channel (``_int8_serial``).  Python's per-GEMV
# dispatch (attrs, reshapes of the package's memmaps, an output array each) was ~25 us per
# layer; here a layer is one call on buffers made once.
# int4 matrices as ``gemv_int4_jit`` hands them over: packed [N/G, B/2, G * K/B] uint8, scales
# [N/G, G * K/B] as uint16 (float16 bits); the dot layout's flat (bytes [N * K/2], float16 bits
# [N * K/B]); int8: q [N, K], scale [N] (block and group unused), or in the int8 dot layout
# q + 128 flat [N * K] uint8 beside scale [N] float32 (told from int4's by the scales' type).
# ``group`` is the first matrix's: the int4 kernel reads each matrix's own from its shapes (a
# layer's groups may differ, gemv.choose_group).  The kernels it inlines from other files are
# compiled afresh when any engine file changes (jit.compiled_dir), not only this one.
_Q4 = (jit.array(types.uint8, 3, "C", readonly=True), jit.array(types.uint16, 2, "C", readonly=True))
_DOT = (jit.array(types.uint8, 1, "C", readonly=True), jit.array(types.uint16, 1, "C", readonly=True))
_DOT8 = (jit.array(types.uint8, 1, "C", readonly=True), _IN)
_I8 = (jit.array(types.int8, 2, "C", readonly=True), _IN)
_MIDDLE = (_I64, _I64, _F32, jit.array(_F32, 2, "C"))
_SCRATCH = (_OUT, _OUT, _OUT, _OUT, _OUT, _OUT, _IN)


def _signatures(cache: tuple) -> list:
    """x, a, (qkv, o, gate_up, down) matrices, block, group, qkv bias, o bias, post norm, next
    norm, eps, cos, sin, kv heads, position, scale, q, the cache's arrays, then scratch: qkv out,
    attended, o out, gate_up out, hidden, down out, empty; one signature per matrix kind."""
    norms = (_IN, _IN, _IN, _IN, types.float64, _IN, _IN)
    return [
        types.void(_OUT, _OUT, *(kind * 4), _I64, _I64, *norms, *_MIDDLE, *cache, *_SCRATCH)
        for kind in (_Q4, _DOT, _DOT8, _I8)
    ]


@numba.njit(inline="always", cache=True)
def _dot(x, w, s, block, out):  # noqa: ANN001, ANN202
    """dot_jit's GEMV with its scratch: x as int8, and per 32 inputs a start and d_x."""
    scratch = (
        np.empty(x.size, np.int8),
        np.empty(x.size // SUB, np.int32),
        np.empty(x.size // SUB, np.float32),
    )
    gemv_dot(x, w, s, block, *scratch, out)


@numba.njit(inline="always", cache=True)
def _dot8(x, w, s, out):  # noqa: ANN001, ANN202
    """dot_jit's int8 GEMV with its scratch (as ``_dot``)."""
    scratch = (
        np.empty(x.size, np.int8),
        np.empty(x.size // SUB, np.int32),
        np.empty(x.size // SUB, np.float32),
    )
    gemv_dot8(x, w, s, *scratch, out)


def _gemv(x, w, s, block, group, out):  # noqa: ANN001, ANN202
    """out = W x for either matrix kind above (typed by ``_gemv_for``)."""


@numba.extending.overload(_gemv, inline="always")
def _gemv_for(x, w, s, block, group, out):  # noqa: ANN001, ANN202
    if w.ndim == 3:
        return lambda x, w, s, block, group, out: _int4_grouped_q8(x, w, s, block, group, out)
    if w.ndim == 1 and s.dtype == types.float32:  # int8 on the dot layout
        return lambda x, w, s, block, group, out: _dot8(x, w, s, out)
    if w.ndim == 1:  # the dot layout
        return lambda x, w, s, block, group, out: _dot(x, w, s, block, out)
    return lambda x, w, s, block, group, out: _int8_serial(x, w, s, out)


@numba.njit(inline="always", cache=True)
def _mlp(x, a, o_w, o_s, gu_w, gu_s, d_w, d_s, block, group, o_bias, post, after, eps, scratch):  # noqa: ANN001, ANN202, E501
    """o GEMV, residual add + post norm, gate/up GEMV, SwiGLU, down GEMV, residual add + the
    next norm: the layer after its attention."""
    _, attended, o_out, gu_out, hidden, d_out, empty = scratch
    _gemv(attended, o_w, o_s, block, group, o_out)
    add_norm(x, o_out, o_bias, post, eps, a)
    _gemv(a, gu_w, gu_s, block, group, gu_out)
    swiglu(gu_out, hidden)
    _gemv(hidden, d_w, d_s, block, group, d_out)
    add_norm(x, d_out, empty, after, eps, a)


@jit.njit(_signatures((_CACHE, _CACHE)))
def layer(x, a, qkv_w, qkv_s, o_w, o_s, gu_w, gu_s, d_w, d_s, block, group, qkv_bias, o_bias, post, after, eps, cos, sin, kv_heads, position, scale, q, keys, values, qkv_out, attended, o_out, gu_out, hidden, d_out, empty):  # noqa: ANN001, ANN202, E501  # fmt: skip
    """One decode layer over a float32 cache: x (the residual stream) is updated in place and a
    becomes the next layer's normalized input (``after``: its input norm, or the final one)."""
    _gemv(a, qkv_w, qkv_s, block, group, qkv_out)
    attend(qkv_out, qkv_bias, cos, sin, kv_heads, position, scale, q, keys, values, attended)
    scratch = (qkv_out, attended, o_out, gu_out, hidden, d_out, empty)
    _mlp(x, a, o_w, o_s, gu_w, gu_s, d_w, d_s, block, group, o_bias, post, after, eps, scratch)


@jit.njit(_signatures((_CACHE8, _SCALES, _CACHE8, _SCALES)))
def layer_int8_cache(x, a, qkv_w, qkv_s, o_w, o_s, gu_w, gu_s, d_w, d_s, block, group, qkv_bias, o_bias, post, after, eps, cos, sin, kv_heads, position, scale, q, keys, key_scales, values, value_scales, qkv_out, attended, o_out, gu_out, hidden, d_out, empty):  # noqa: ANN001, ANN202, E501  # fmt: skip
    """``layer`` over an int8 cache."""
    _gemv(a, qkv_w, qkv_s, block, group, qkv_out)
    cache = (keys, key_scales, values, value_scales)
    attend_int8(qkv_out, qkv_bias, cos, sin, kv_heads, position, scale, q, *cache, attended)
    scratch = (qkv_out, attended, o_out, gu_out, hidden, d_out, empty)
    _mlp(x, a, o_w, o_s, gu_w, gu_s, d_w, d_s, block, group, o_bias, post, after, eps, scratch)


# no kernel-layer op of its own: model.py calls these directly (``jit.module``)
CANDIDATES: dict = {}
