"""A decode token's layers shared by several threads at once (numba), for model.py through
spread.py, which runs ``token_work`` on each thread after one ``token_open``.

Why a token at a time: a layer's GEMVs take 0.05-0.3 ms, and waking a pool for each cost as
much as the second thread saved (a sleeping thread takes 30-75 us to wake on the 2-core hosts,
and the first thread back waits for the last).  Here the threads are woken once per token;
inside, they take each GEMV's vectors of 16 rows from a shared counter and the work between two
GEMVs (attention, norms, SwiGLU, rounding the next input to int8) is done by whichever thread
finishes the GEMV's last vector, while the others spin on the next GEMV's opening (llama.cpp's
threads meet the same way at every operator).

Nothing waits for a thread that has not started: a vector is only ever waited for by the
thread that claimed it, so one worker alone does every step itself.  The sums are the serial
kernels' (the same ``_rows`` / ``_rows8`` per vector), so the logits are layer_jit's bit for bit.

The weights come as a table of addresses (spread.py's ``tables``), not typed lists, so the same
two functions compile ahead of time too (aot.py) and run without numba in the process.

Covers the converter's int8 and int4 packages on the dot layouts with a float32 cache; model.py
keeps layer_jit's one-call layers elsewhere.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types

from engine import jit
from engine.llm.dot_jit import LANES, _activations, _gemv_vector, _gemv_vector8
from engine.llm.layer_jit import add_norm, attend, swiglu
from engine.ops.atomic_jit import array_at as _at
from engine.ops.atomic_jit import atomic_add, atomic_load, atomic_store, pause

CLAIMS = 16  # claims per GEMV: a claim is a cache line passed between cores (~0.1-0.2 us)


def _vector(w, s, block, xq, off, dx, out, v):  # noqa: ANN001, ANN202
    """Rows 16 v .. 16 v + 15 of W x (x already rounded into xq/off/dx); int8 has float32
    scales per row, int4 float16 bits per block (typed by ``_vector_for``)."""


@numba.extending.overload(_vector, inline="always")
def _vector_for(w, s, block, xq, off, dx, out, v):  # noqa: ANN001, ANN202
    if s.dtype == types.float32:  # int8: w is N x K bytes
        return lambda w, s, block, xq, off, dx, out, v: _gemv_vector8(
            w, s, xq, off, dx, w.size // out.size, v, out
        )
    # int4: w is N x K / 2 bytes
    return lambda w, s, block, xq, off, dx, out, v: _gemv_vector(
        w, s, block, xq, off, dx, 2 * w.size // out.size, v, out
    )


@numba.njit(inline="always", cache=True)
def _round(x, block, xq, off, dx):  # noqa: ANN001, ANN202
    """The next GEMV's input rounded to int8 per block, as gemv_dot / gemv_dot8 round it."""
    _activations(x, 1, block, xq, off, dx)  # the scratch fits the widest input: x's part used


@numba.njit(inline="always", cache=True)
def _between(p, layers, floats, eps, rope, cache, buffers, scratch):  # noqa: ANN001, ANN202
    """The serial work after GEMV ``p`` (layer p // 4: qkv, o, gate/up, down) and before the
    next: layer_jit's ``layer`` between its GEMVs.  ``floats`` lists per layer its post-attention
    norm, the next norm (the next layer's input norm, or the final norm), its qkv bias and its o
    bias (empty for none)."""
    x, a, q, qkv_out, attended, o_out, gu_out, hidden, d_out, empty, logits = buffers
    xq, off, dx, block = scratch
    cos, sin, kv_heads, position, scale = rope
    f32 = np.float32
    layer, j = p // 4, p % 4
    if j == 0:
        keys, values = cache[layer, 0], cache[layer, 1]
        attend(
            qkv_out,
            _at(floats, 4 * layer + 2, f32),
            cos,
            sin,
            kv_heads,
            position,
            scale,
            q,
            keys,
            values,
            attended,
        )
        _round(attended, block, xq, off, dx)
    elif j == 1:
        bias, norm = _at(floats, 4 * layer + 3, f32), _at(floats, 4 * layer, f32)
        add_norm(x, o_out, bias, norm, eps, a)
        _round(a, block, xq, off, dx)
    elif j == 2:
        swiglu(gu_out, hidden)
        _round(hidden, block, xq, off, dx)
    else:
        add_norm(x, d_out, empty, _at(floats, 4 * layer + 1, f32), eps, a)
        if layer + 1 < layers or logits.size:  # the next layer's input, or the LM head's
            _round(a, block, xq, off, dx)


@numba.njit(inline="always", cache=True)
def _work(matrices, like, floats, eps, rope, cache, buffers, scratch, state):  # noqa: ANN001, ANN202
    """One thread's part of a token: every GEMV's unclaimed vectors, in order, and the serial
    work after a GEMV when it finishes that GEMV's last vector.  ``matrices``: per GEMV its
    weights' and its scales' (of ``like``'s dtype) rows in ``tables``; ``state``: per GEMV a
    claim and a done counter, then the number of GEMVs open (their input rounded)."""
    phases = matrices.shape[0] // 2
    layers = phases // 4  # and the LM head after them when ``logits`` is not empty
    _, _, _, qkv_out, _, o_out, gu_out, _, d_out, _, logits = buffers
    outputs = (qkv_out, o_out, gu_out, d_out)
    xq, off, dx, block = scratch
    opened = 2 * phases
    for p in range(phases):
        while atomic_load(state, opened) <= p:
            pause()
        out = logits if p == 4 * layers else outputs[p % 4]
        w, s = _at(matrices, 2 * p, np.uint8), _at(matrices, 2 * p + 1, like)
        count = out.size // LANES
        chunk = max(1, count // CLAIMS)
        while True:
            first = atomic_add(state, 2 * p, chunk)
            if first >= count:
                break
            last = min(first + chunk, count)
            for v in range(first, last):
                _vector(w, s, block, xq, off, dx, out, v)
            if atomic_add(state, 2 * p + 1, last - first) + last - first == count and p < 4 * layers:
                _between(p, layers, floats, eps, rope, cache, buffers, scratch)
                atomic_store(state, opened, p + 2)


def _signatures() -> tuple[list, list]:
    """``token_open``'s and ``token_work``'s.  token_work: matrices and floats (``tables``), like
    (an empty array of the scales' dtype: int8 float32 per row, int4 float16 bits per block),
    eps, (cos, sin, kv heads, position, scale), the float32 cache [layers, 2, kv heads, context,
    d], (x, a, q, qkv out, attended, o out, gate/up out, hidden, down out, empty, logits: empty
    when the LM head is not the tables' last GEMV), (xq, off, dx, block), state."""
    f32 = types.float32
    vector, readonly = jit.array(f32, 1, "C"), jit.array(f32, 1, "C", readonly=True)
    table = jit.array(types.int64, 2, "C", readonly=True)
    rope = types.Tuple((vector, vector, types.int64, types.int64, f32))
    buffers = types.Tuple((vector, vector, jit.array(f32, 2, "C"), *([vector] * 8)))
    scratch = types.Tuple(
        (jit.array(types.int8, 1, "C"), jit.array(types.int32, 1, "C"), vector, types.int64)
    )
    state = jit.array(types.int64, 1, "C")
    rest = (table, types.float64, rope, jit.array(f32, 5, "C"), buffers, scratch, state)
    work = [
        types.void(table, like, *rest) for like in (readonly, jit.array(types.uint16, 1, "C", readonly=True))
    ]
    return [types.void(vector, scratch, state)], work


@jit.njit(_signatures()[0])
def token_open(a, scratch, state):  # noqa: ANN001, ANN202
    """Before a token's workers start: the counters zeroed, the first GEMV's input ``a`` rounded
    and that GEMV opened."""
    xq, off, dx, block = scratch
    state[:] = 0
    _round(a, block, xq, off, dx)
    state[state.size - 1] = 1


@jit.njit(_signatures()[1])
def token_work(matrices, like, floats, eps, rope, cache, buffers, scratch, state):  # noqa: ANN001, ANN202
    """One worker of a token opened by ``token_open``: any number may run at once, each on its
    own thread (GIL released), and one alone does the whole token."""
    _work(matrices, like, floats, eps, rope, cache, buffers, scratch, state)


# no kernel-layer op of its own: model.py calls these directly (``jit.module``)
CANDIDATES: dict = {}
