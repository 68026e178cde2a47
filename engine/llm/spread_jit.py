"""A decode step's layers on several threads in one parallel region (numba), for model.py.

Why one region: a layer's GEMVs take 0.05-0.3 ms, and waking numba's pool for each cost as
much as the second thread saved (its workqueue threads sleep between calls: 30-75 us a launch
on the 2-core hosts, and the first thread back waits for the last).  Here the pool is woken
once per token; inside, the threads take each GEMV's vectors of 16 rows from a shared counter
and the work between two GEMVs (attention, norms, SwiGLU, rounding the next input to int8) is
done by whichever thread finishes the GEMV's last vector, while the others spin on the next
GEMV's opening (llama.cpp's threads meet the same way at every operator).

Nothing waits for a thread that has not started: a vector is only ever waited for by the
thread that claimed it, so one thread alone (a pool that runs the workers one after another)
does every step itself.  There is no serial twin: with numba's pool taken (another session's
kernel), model.py runs layer_jit's one-call layers instead.  The sums are the serial kernels' (the
same ``_rows`` / ``_rows8`` per vector), so the logits are layer_jit's bit for bit.

Covers the converter's int8 and int4 packages on the dot layouts with a float32 cache; model.py
keeps layer_jit's one-call layers elsewhere.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba import prange, typed, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine import jit
from engine.llm.dot_jit import BLOCK8, LANES, SUB, _activations, _gemv_vector, _gemv_vector8
from engine.llm.layer_jit import add_norm, attend, swiglu

_I64 = ir.IntType(64)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _slot(context, builder, signature, args):  # noqa: ANN001, ANN202
    """A pointer to ``array[index]`` of an int64 array."""
    array_type = signature.args[0]
    array = context.make_array(array_type)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, array_type, array, [args[1]])


@intrinsic
def atomic_add(typingctx, array, index, value):  # noqa: ANN001, ANN201, ARG001
    """array[index] += value atomically; the value before."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.atomic_rmw("add", _slot(context, builder, signature, args), args[2], "seq_cst")

    return types.int64(array, types.intp, types.int64), codegen


@intrinsic
def atomic_load(typingctx, array, index):  # noqa: ANN001, ANN201, ARG001
    """array[index], read after every write another thread made before its release store."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.load_atomic(_slot(context, builder, signature, args), "acquire", 8)

    return types.int64(array, types.intp), codegen


@intrinsic
def atomic_store(typingctx, array, index, value):  # noqa: ANN001, ANN201, ARG001
    """array[index] = value, after (as other threads see it) every write this thread made."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        builder.store_atomic(args[2], _slot(context, builder, signature, args), "release", 8)
        return context.get_dummy_value()

    return types.void(array, types.intp, types.int64), codegen


@intrinsic
def pause(typingctx):  # noqa: ANN001, ANN201, ARG001
    """A spin-wait hint (x86's pause: the sibling hyperthread and the power budget get the cycles)."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if _X86:
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
            )
            builder.call(function, [])
        return context.get_dummy_value()

    return types.void(), codegen


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
def _between(p, layers, norms, biases, eps, rope, cache, buffers, scratch):  # noqa: ANN001, ANN202
    """The serial work after GEMV ``p`` (layer p // 4: qkv, o, gate/up, down) and before the
    next: layer_jit's ``layer`` between its GEMVs."""
    x, a, q, qkv_out, attended, o_out, gu_out, hidden, d_out, empty = buffers
    xq, off, dx, block = scratch
    cos, sin, kv_heads, position, scale = rope
    layer, j = p // 4, p % 4
    if j == 0:
        keys, values = cache[layer, 0], cache[layer, 1]
        attend(qkv_out, biases[2 * layer], cos, sin, kv_heads, position, scale, q, keys, values, attended)
        _round(attended, block, xq, off, dx)
    elif j == 1:
        add_norm(x, o_out, biases[2 * layer + 1], norms[2 * layer], eps, a)
        _round(a, block, xq, off, dx)
    elif j == 2:
        swiglu(gu_out, hidden)
        _round(hidden, block, xq, off, dx)
    else:
        add_norm(x, d_out, empty, norms[2 * layer + 1], eps, a)
        if layer + 1 < layers:
            _round(a, block, xq, off, dx)


@numba.njit(inline="always", cache=True)
def _work(weights, scales, norms, biases, eps, rope, cache, buffers, scratch, state):  # noqa: ANN001, ANN202
    """One thread's part of a token: every GEMV's unclaimed vectors, in order, and the serial
    work after a GEMV when it finishes that GEMV's last vector.  ``state``: per GEMV a claim
    and a done counter, then the number of GEMVs open (their input rounded)."""
    phases = len(weights)
    layers = phases // 4
    _, _, _, qkv_out, _, o_out, gu_out, _, d_out, _ = buffers
    outputs = (qkv_out, o_out, gu_out, d_out)
    xq, off, dx, block = scratch
    opened = 2 * phases
    for p in range(phases):
        while atomic_load(state, opened) <= p:
            pause()
        out, w, s = outputs[p % 4], weights[p], scales[p]
        count = out.size // LANES
        while True:
            v = atomic_add(state, 2 * p, 1)
            if v >= count:
                break
            _vector(w, s, block, xq, off, dx, out, v)
            if atomic_add(state, 2 * p + 1, 1) + 1 == count:
                _between(p, layers, norms, biases, eps, rope, cache, buffers, scratch)
                atomic_store(state, opened, p + 2)


@numba.njit(inline="always", cache=True)
def _open(a, scratch, state):  # noqa: ANN001, ANN202
    """The first GEMV opened: counters zeroed, ``a`` rounded."""
    xq, off, dx, block = scratch
    state[:] = 0
    _round(a, block, xq, off, dx)
    state[state.size - 1] = 1


def _signatures() -> list:
    """weights, scales (int8: float32 per row; int4: float16 bits per block), norms (per layer:
    post-attention, then the next one's input norm or the final norm), biases (per layer: qkv,
    o; empty for none), eps, (cos, sin, kv heads, position, scale), the float32 cache [layers,
    2, kv heads, context, d], (x, a, q, qkv out, attended, o out, gate/up out, hidden, down
    out, empty), (xq, off, dx, block), state."""
    f32 = types.float32
    vector, readonly = jit.array(f32, 1, "C"), jit.array(f32, 1, "C", readonly=True)
    weights = types.ListType(jit.array(types.uint8, 1, "C", readonly=True))
    rope = types.Tuple((vector, vector, types.int64, types.int64, f32))
    buffers = types.Tuple((vector, vector, jit.array(f32, 2, "C"), *([vector] * 7)))
    scratch = types.Tuple(
        (jit.array(types.int8, 1, "C"), jit.array(types.int32, 1, "C"), vector, types.int64)
    )
    rest = (
        types.ListType(readonly),
        types.ListType(readonly),
        types.float64,
        rope,
        jit.array(f32, 5, "C"),
        buffers,
        scratch,
        jit.array(types.int64, 1, "C"),
        types.int64,
    )
    int8 = types.ListType(readonly)
    int4 = types.ListType(jit.array(types.uint16, 1, "C", readonly=True))
    return [types.void(weights, kind, *rest) for kind in (int8, int4)]


@jit.njit(_signatures(), parallel=True)
def token_parallel(weights, scales, norms, biases, eps, rope, cache, buffers, scratch, state, workers):  # noqa: ANN001, ANN202
    """Every layer of one decode token, its GEMVs shared by ``workers`` of numba's threads (the
    count numba runs: more iterations than threads would only run one after another)."""
    _open(buffers[1], scratch, state)
    for _ in prange(workers):
        _work(weights, scales, norms, biases, eps, rope, cache, buffers, scratch, state)


def _readonly(array: np.ndarray) -> np.ndarray:
    view = np.asarray(array).view(np.ndarray)
    view.flags.writeable = False
    return view


def _listed(arrays: list[np.ndarray]) -> typed.List:
    """``arrays`` as a numba typed list of read-only views (``token_parallel`` takes them)."""
    found = typed.List.empty_list(numba.typeof(_readonly(arrays[0])))
    for array in arrays:
        found.append(_readonly(array))
    return found


def warm_lists() -> None:
    """Compile numba's typed-list helpers for ``arguments``' item types now (at activation):
    their first use in a process takes ~0.8 s, which the first token would otherwise pay."""
    for dtype in (np.uint8, np.float32, np.uint16):
        _listed([np.zeros(1, dtype)])


def arguments(layers: list[tuple], norms: list[np.ndarray], biases: list[np.ndarray], widest: int) -> tuple:
    """``token_parallel``'s arguments that stay from token to token, made once per model: layers as
    model.py's ``one_call`` holds them (each layer's four (weights, scales) of one kind on the
    dot layouts, its block), norms and biases as ``_signatures`` orders them, scratch for
    inputs up to ``widest`` wide, the state counters."""
    # the typed lists are only handed over: reading them here would compile their getters
    weights = [layer[2 * i] for layer in layers for i in range(4)]
    scales = [layer[2 * i + 1] for layer in layers for i in range(4)]
    block = BLOCK8 if scales[0].dtype == np.float32 else int(layers[0][8])
    scratch = (
        np.empty(widest, np.int8),
        np.empty(widest // SUB, np.int32),
        np.empty(widest // SUB, np.float32),
        block,
    )
    state = np.zeros(2 * len(weights) + 1, np.int64)
    return _listed(weights), _listed(scales), _listed(norms), _listed(biases), scratch, state


# no kernel-layer op of its own: model.py calls these directly (``jit.module``)
CANDIDATES: dict = {}
