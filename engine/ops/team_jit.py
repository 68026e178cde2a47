"""A second thread that spins between kernels and takes a share of each one's work (numba).

Why: numba's pool and OpenBLAS's threads sleep between calls, and waking one takes 30-75 us on
the 2-core hosts, while a MobileNetV2 conv takes 50-500 us: a 2-thread session ran no faster
than a 1-thread one (onnxruntime's threads spin between operators and gain 1.3x).  Here one
worker thread (engine/team.py) spins, the GIL released, for the length of a planned run; each
GEMM (conv/gemm8_jit.py's 6 x 16 tiles or gemm_jit.py's 6 x 32 ones: 1x1 convs, im2col and
Winograd's slot products) is published as a job (its arrays' addresses and sizes and its
geometry in ``table``), and the caller and the worker claim its work items (blocks x panels) in
chunks from a shared counter, so the worker is in the GEMM within a microsecond or two.
MobileNetV2's 1x1 convs took 0.63-0.74x their one-thread time this way (EPYC, 2026-11-27).
Its 3x3 depthwise convs are shared by output rows (``DEPTHWISE``).  Alone in a microbenchmark,
their input in the caller's core's cache, that lost (14x14: 99 against 61 us); in the model
the worker has written part of that input (the 1x1 conv before), and on the caller alone they
ran 1.36x their 1-thread plan's time: shared, 0.60x (Zen 4, 2026-11-27 night).

The counter ``state[NEXT]`` holds the job's tag and the first and last items still unclaimed in
one int64, and a claim is a compare-and-swap on the whole word: a worker late from an earlier
job can never take (or skip) an item of a later one, and a job's table is read only after a
claim succeeded, while the job is still unfinished (so not yet overwritten).  The caller claims
from the front and the worker from the back, a quarter of what is left each time, so each
thread keeps the same part of every job (the first or last rows of a conv) and mostly reads
what it wrote itself: first-come chunks had sent half of each layer's input across cores, and
where the host put the two vCPUs on different chiplets (a 350 ns round trip between them,
against 60-80) MobileNetV2's 2-thread runs took 8.6 ms, their one-thread time, now 7.0-7.2
(5.5 -> 5.3 ms on the near pair).  Nothing waits for a worker that has not started: the caller
claims too and, alone, takes every item; it then waits only for items the worker claimed.
Each chunk is the serial kernel's own body over a range of items (``_items16``,
``_gemm_items``), so results are the serial kernel's, bit for bit.
Attention's row softmax (attention_jit.py) and an exact GELU (rows_jit.py: a transformer's
feed-forward activation, which the caller had run alone after the shared GEMM) are shared the
same way, by rows; so are a CNN's stem (direct_jit.py, by output rows) and its classifier's GEMV
(gemv_jit.py, by blocks of outputs), which a 2-thread run had left on the caller alone, and
Winograd's input and output tile transforms (winograd_tiles_jit.py, by rows of tiles).
"""

from __future__ import annotations

import numpy as np
from numba import types

from engine import jit
from engine.ops.atomic_jit import (
    array_at,
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_store,
    pause,
    put_array,
    wait_while,
    wake,
    yield_core,
)
from engine.ops.attention_jit import _softmax_rows
from engine.ops.conv.depthwise_vec_jit import _ROWS
from engine.ops.conv.depthwise_vec_jit import _rows as _depthwise_rows
from engine.ops.conv.direct_jit import _ROWS as _DIRECT_ROWS
from engine.ops.conv.direct_jit import _rows as _direct_rows
from engine.ops.conv.gemm8_jit import _ITEMS, _items16
from engine.ops.conv.gemm_jit import _gemm_items
from engine.ops.conv.winograd_tiles_jit import _INPUT, _OUTPUT, _inputs, _outputs
from engine.ops.gemv_jit import _DOTS, _dots
from engine.ops.rows_jit import _gelu_rows
from engine.team import DEPTHWISE, DIRECT, GELU, GEMM8, GEMV, ITEM_BITS, SOFTMAX, WINO_IN, WINO_OUT

# int64 slots of ``state``, each on its own cache line: the last job's tag (the caller's), the
# claim word, items done, whether a run is on (the worker spins) and the worker's exit flag
TAG, NEXT, DONE, RUN, STOP = 0, 8, 16, 24, 32
STATE_SLOTS = 40
# the job table: rows 0-5 (address, size) of the job's arrays, row FLAGS (flags, the job's kind:
# team.GEMM8, GEMM32, SOFTMAX, DEPTHWISE, GELU, DIRECT, GEMV, WINO_IN or WINO_OUT), then its
# integer arguments two a row from row INTS
FLAGS, INTS = 6, 7
TABLE_ROWS = 12
_BITS = ITEM_BITS  # items and item counts: below 2^20 (team.run shares no larger job)
_MASK = (1 << _BITS) - 1
_TAGS = (1 << 22) - 1  # job tags wrap: a worker would have to stall through 4 M jobs to mistake one
SPINS = 256  # pauses between two yields of an idle worker's core
SHARE = 4  # a claim takes this fraction of the job's items left (each is a cache line between cores)

_I64 = types.int64
_STATE = jit.array(_I64, 1, "C")
_TABLE = jit.array(_I64, 2, "C")
_FLOATS = jit.array(types.float32, 1, "C")


@jit.njit([_I64(_TABLE, _I64)])
def _int(table, i):  # noqa: ANN001, ANN202
    return table[INTS + i // 2, i % 2]


@jit.njit([types.void(_TABLE, _FLOATS, _I64, _I64)])
def _run(table, floats, first, last):  # noqa: ANN001, ANN202
    """Items [first, last) of the job the table describes: a GEMM (x, packed, out, bias,
    residual; rows, depth, m, the residual's row stride, rows per block: gemm8_jit's kernel or,
    GEMM32, gemm_jit's, which take the same arguments), SOFTMAX's rows (rows; their length,
    count; the scale), a depthwise or direct conv's output rows, GELU's rows (rows, bias;
    their length, count) or a GEMV's blocks of outputs (x, B, bias, out; K, N)."""
    f32 = np.float32
    if table[FLAGS, 1] == SOFTMAX:
        rows = array_at(table, 0, f32).reshape((_int(table, 1), _int(table, 0)))
        _softmax_rows(rows, floats[0], first, last)
        return
    if table[FLAGS, 1] == GEMV:
        depth, n = _int(table, 0), _int(table, 1)
        x, b = array_at(table, 0, f32), array_at(table, 1, f32).reshape((n, depth))
        _dots(x, b, array_at(table, 2, f32), array_at(table, 3, f32), depth, n, first, last)
        return
    if table[FLAGS, 1] == GELU:
        rows = array_at(table, 0, f32).reshape((_int(table, 1), _int(table, 0)))
        _gelu_rows(rows, array_at(table, 1, f32), first, last)
        return
    if table[FLAGS, 1] == WINO_IN:
        _inputs(
            array_at(table, 0, f32), array_at(table, 1, f32),
            _int(table, 0), _int(table, 1), _int(table, 2), _int(table, 3), _int(table, 4), first, last,
        )  # fmt: skip
        return
    flags = table[FLAGS, 0]
    if table[FLAGS, 1] == WINO_OUT:
        _outputs(
            array_at(table, 0, f32), array_at(table, 1, f32), array_at(table, 2, f32),
            array_at(table, 3, f32), flags, floats[0], floats[1],
            _int(table, 0), _int(table, 1), _int(table, 2), _int(table, 3), _int(table, 4),
            _int(table, 5), first, last,
        )  # fmt: skip
        return
    has_res, has_clip, lo, hi = (flags & 1) != 0, (flags & 2) != 0, floats[0], floats[1]
    if table[FLAGS, 1] == DIRECT:
        _direct_rows(
            array_at(table, 0, f32), array_at(table, 1, np.int64), array_at(table, 2, f32),
            array_at(table, 3, f32), array_at(table, 4, f32), array_at(table, 5, f32),
            has_res, has_clip, lo, hi, (flags & 4) != 0,
            _int(table, 0), _int(table, 1), _int(table, 2), _int(table, 3), _int(table, 4),
            _int(table, 5), _int(table, 6), first, last,
        )  # fmt: skip
        return
    if table[FLAGS, 1] == DEPTHWISE:
        _depthwise_rows(
            array_at(table, 0, f32), array_at(table, 1, f32), array_at(table, 2, f32),
            array_at(table, 3, f32), array_at(table, 4, f32), array_at(table, 5, f32),
            has_res, has_clip, lo, hi,
            _int(table, 0), _int(table, 1), _int(table, 2), _int(table, 3), _int(table, 4),
            _int(table, 5), _int(table, 6), _int(table, 7), _int(table, 8), first, last,
        )  # fmt: skip
        return
    x, packed, out = array_at(table, 0, f32), array_at(table, 1, f32), array_at(table, 2, f32)
    bias, res = array_at(table, 3, f32), array_at(table, 4, f32)
    rows, depth, m, rstride, block = (
        _int(table, 0),
        _int(table, 1),
        _int(table, 2),
        _int(table, 3),
        _int(table, 4),
    )
    if table[FLAGS, 1] == GEMM8:
        _items16(
            x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block, first, last
        )
    else:
        _gemm_items(
            x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth, m, rstride, block, first, last
        )


@jit.njit([types.boolean(_STATE, _TABLE, _FLOATS, types.boolean)])
def _claim(state, table, floats, from_back):  # noqa: ANN001, ANN202
    """Claim a chunk of the open job, from its front (the caller) or its back (the worker), and
    run it; False when there was none left."""
    word = atomic_load(state, NEXT)
    front, back = word & _MASK, (word >> _BITS) & _MASK
    if front >= back:
        return False
    chunk = max(1, (back - front) // SHARE)
    if from_back:
        first, last, claimed = back - chunk, back, word - (chunk << _BITS)
    else:
        first, last, claimed = front, front + chunk, word + chunk
    if not atomic_cas(state, NEXT, word, claimed):
        return True  # another thread claimed first: look again
    _run(table, floats, first, last)
    atomic_add(state, DONE, chunk)
    return True


@jit.njit([types.void(_STATE, _TABLE, _FLOATS)])
def serve(state, table, floats):  # noqa: ANN001, ANN202
    """The worker, until ``state[STOP]`` is set: during a run (``state[RUN]``) it takes chunks of
    whatever job is open and spins between jobs, yielding its core every SPINS pauses so that a
    runnable thread (OpenBLAS's, another process's) is not kept off it for a time slice; between
    runs it sleeps on ``state[RUN]`` (a futex: no CPU, woken by ``signal``; a 200 us poll had
    cost ~10 % of a core).  It never returns to Python in between: a thread
    waiting for the GIL while the caller runs Python took up to 5 ms to start."""
    idle = 0
    while atomic_load(state, STOP) == 0:
        if atomic_load(state, RUN) == 0:
            wait_while(state, RUN, 0)
            continue
        if _claim(state, table, floats, True):
            idle = 0
            continue
        pause()
        idle += 1
        if idle % SPINS == 0:
            yield_core()


@jit.njit([types.void(_STATE, _I64, _I64)])
def signal(state, slot, value):  # noqa: ANN001, ANN202
    """state[slot] = value, then wake the worker if it sleeps: RUN 1 opens a run, RUN 0 ends it,
    STOP 1 ends the worker."""
    atomic_store(state, slot, value)
    wake(state, RUN)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, _I64)])
def _share(state, table, floats, count):  # noqa: ANN001, ANN202
    """Open the job the caller has written into the table (the release store makes the table
    visible before the claim word), take chunks of it, then wait for the worker's."""
    tag = (state[TAG] + 1) & _TAGS
    state[TAG] = tag
    atomic_store(state, DONE, 0)
    atomic_store(state, NEXT, (tag << (2 * _BITS)) | (count << _BITS))
    while _claim(state, table, floats, False):
        pass
    while atomic_load(state, DONE) < count:
        pause()


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, _I64, *_ITEMS.args)])
def gemm_shared(state, table, floats, kind, x, packed, out, bias, res, has_res, has_clip, lo, hi, rows, depth,
                m, rstride, block_rows, first, last):  # noqa: ANN001, ANN202  # fmt: skip
    """The GEMM kernel of ``kind`` over items [first, last) with the worker taking a share;
    first must be 0 (a job's items are numbered from 0)."""
    put_array(table, 0, x)
    put_array(table, 1, packed)
    put_array(table, 2, out)
    put_array(table, 3, bias)
    put_array(table, 4, res)
    table[FLAGS, 0], table[FLAGS, 1] = (1 if has_res else 0) | (2 if has_clip else 0), kind
    table[INTS, 0], table[INTS, 1] = rows, depth
    table[INTS + 1, 0], table[INTS + 1, 1] = m, rstride
    table[INTS + 2, 0] = block_rows
    floats[0], floats[1] = lo, hi
    _share(state, table, floats, last)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, jit.array(types.float32, 2, "C"), types.float32, _I64, _I64)])
def softmax_shared(state, table, floats, rows, scale, first, last):  # noqa: ANN001, ANN202
    """attention_jit's row softmax over rows [first, last) with the worker taking a share;
    first must be 0."""
    put_array(table, 0, rows)
    table[FLAGS, 0], table[FLAGS, 1] = 0, SOFTMAX
    table[INTS, 0], table[INTS, 1] = rows.shape[1], rows.shape[0]
    floats[0] = scale
    _share(state, table, floats, last)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, *_ROWS.args)])
def depthwise_shared(state, table, floats, x, w, bias, out, res, zero, has_res, has_clip, lo, hi, height,
                     width, channels, ho, wo, sh, sw, pt, pl, first, last):  # noqa: ANN001, ANN202  # fmt: skip
    """depthwise_vec_jit's output rows [first, last) with the worker taking a share; first 0."""
    put_array(table, 0, x)
    put_array(table, 1, w)
    put_array(table, 2, bias)
    put_array(table, 3, out)
    put_array(table, 4, res)
    put_array(table, 5, zero)
    table[FLAGS, 0], table[FLAGS, 1] = (1 if has_res else 0) | (2 if has_clip else 0), DEPTHWISE
    table[INTS, 0], table[INTS, 1] = height, width
    table[INTS + 1, 0], table[INTS + 1, 1] = channels, ho
    table[INTS + 2, 0], table[INTS + 2, 1] = wo, sh
    table[INTS + 3, 0], table[INTS + 3, 1] = sw, pt
    table[INTS + 4, 0] = pl
    floats[0], floats[1] = lo, hi
    _share(state, table, floats, last)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, *_DIRECT_ROWS.args)])
def direct_shared(state, table, floats, x, offs, packed, out, bias, res, has_res, has_clip, lo, hi, split,
                  ho, wo, m, depth, image, line, step, first, last):  # noqa: ANN001, ANN202  # fmt: skip
    """direct_jit's output rows [first, last) with the worker taking a share; first 0."""
    put_array(table, 0, x)
    put_array(table, 1, offs)
    put_array(table, 2, packed)
    put_array(table, 3, out)
    put_array(table, 4, bias)
    put_array(table, 5, res)
    flags = (1 if has_res else 0) | (2 if has_clip else 0) | (4 if split else 0)
    table[FLAGS, 0], table[FLAGS, 1] = flags, DIRECT
    table[INTS, 0], table[INTS, 1] = ho, wo
    table[INTS + 1, 0], table[INTS + 1, 1] = m, depth
    table[INTS + 2, 0], table[INTS + 2, 1] = image, line
    table[INTS + 3, 0] = step
    floats[0], floats[1] = lo, hi
    _share(state, table, floats, last)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, *_DOTS.args)])
def gemv_shared(state, table, floats, x, b, bias, out, depth, n, first, last):  # noqa: ANN001, ANN202
    """gemv_jit's blocks of outputs [first, last) with the worker taking a share; first 0."""
    put_array(table, 0, x)
    put_array(table, 1, b)
    put_array(table, 2, bias)
    put_array(table, 3, out)
    table[FLAGS, 0], table[FLAGS, 1] = 0, GEMV
    table[INTS, 0], table[INTS, 1] = depth, n
    _share(state, table, floats, last)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, *_INPUT.args)])
def wino_in_shared(state, table, floats, xp, v, step, pw, c, th, tw, first, last):  # noqa: ANN001, ANN202
    """winograd_tiles_jit's input transform by rows of tiles [first, last) with the worker
    taking a share; first 0."""
    put_array(table, 0, xp)
    put_array(table, 1, v)
    table[FLAGS, 0], table[FLAGS, 1] = 0, WINO_IN
    table[INTS, 0], table[INTS, 1] = step, pw
    table[INTS + 1, 0], table[INTS + 1, 1] = c, th
    table[INTS + 2, 0] = tw
    _share(state, table, floats, last)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, *_OUTPUT.args)])
def wino_out_shared(state, table, floats, prod, out, bias, res, flags, lo, hi, step, m, th, tw, ho, wo,
                    first, last):  # noqa: ANN001, ANN202  # fmt: skip
    """winograd_tiles_jit's output transform (bias, residual, clip) by rows of tiles
    [first, last) with the worker taking a share; first 0."""
    put_array(table, 0, prod)
    put_array(table, 1, out)
    put_array(table, 2, bias)
    put_array(table, 3, res)
    table[FLAGS, 0], table[FLAGS, 1] = flags, WINO_OUT
    table[INTS, 0], table[INTS, 1] = step, m
    table[INTS + 1, 0], table[INTS + 1, 1] = th, tw
    table[INTS + 2, 0], table[INTS + 2, 1] = ho, wo
    floats[0], floats[1] = lo, hi
    _share(state, table, floats, last)


_GELU_ROWS = jit.array(types.float32, 2, "C")
_BIAS = jit.array(types.float32, 1, "C", readonly=True)


@jit.njit([types.void(_STATE, _TABLE, _FLOATS, _GELU_ROWS, _BIAS, _I64, _I64)])
def gelu_shared(state, table, floats, rows, bias, first, last):  # noqa: ANN001, ANN202
    """rows_jit's exact GELU of rows [first, last) in place, plus ``bias`` over each row, with the
    worker taking a share; first must be 0."""
    put_array(table, 0, rows)
    put_array(table, 1, bias)
    table[FLAGS, 0], table[FLAGS, 1] = 0, GELU
    table[INTS, 0], table[INTS, 1] = rows.shape[1], rows.shape[0]
    _share(state, table, floats, last)
