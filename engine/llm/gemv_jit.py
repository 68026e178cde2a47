"""Decode's GEMVs as JIT kernels (numba): int8 per-channel and int4 block-wise weights read as
stored, one row dot product at a time, never widened as a whole (the numpy twins in gemv.py
widen a tile to float32 first, a write and a read of four bytes per weight).

int4: with the re-laid nibbles (gemv.py), a block's low nibbles meet x[0:B/2] and its high
ones x[B/2:B], both contiguous, so the inner loops vectorise (byte -> int32 -> float32).  The
stored nibble is q + 8; the 8 is taken out once per block with the block's sum of x
(precomputed once per call) instead of once per weight.  The nibbles are split in float32
(floor(b / 16) is exact for 0..255), with twice the lanes of numba's int64 integer ops, and
the low nibble is never formed: v * xl + floor(v / 16) * (xh - 16 xl), the second factor
precomputed per call (measured on the 49152 x 576 LM head: 72 ms with 2-D indexing and
integer nibbles, 2.9 ms splitting both nibbles in float, 2.4 ms like this; four rows at a time
was slower).

Where it stands (SmolLM2-135M's 49152 x 576 LM head, 1 thread, a loaded host): int8 ~2.9 ms,
about the read bandwidth, so int8 decode is memory-bound.  int4 in the plain layout
(``_int4_serial``) took 17-24 ms, compute-bound on the per-block horizontal sums; the
row-grouped layout the converter now writes (``_int4_grouped``: four rows' blocks side by
side, one accumulator per (row, block), the inner loop 72 lanes wide) takes 2.6 ms, at or
below int8.  Tried and slower in the plain layout: 16 rows interleaved per vector
([N/16, K/2, 16], 15 ms), per-element scales gathered by index (15 ms), a vector accumulator
across blocks (6 ms), literal trip counts (22 ms).

int4 with int8 activations (``_int4_grouped_q8``, the converter's setting: llama.cpp's
q4_0 x q8_0): x rounded to int8 per block, the same grouped lanes accumulated in int16.
numba types integer arithmetic as int64, but an expression cast back with ``np.int16(...)``
is narrowed by LLVM to 16-bit lanes: the inner loop compiles to vpmovzxbw, vpand, vpsrlw,
2x vpmullw, 2x vpaddw per 32 bytes (64 weights) in one AVX-512 register, where the float
kernel needs ~12 instructions per 64 weights in 16-lane float registers.  All 121 GEMVs of a
SmolLM2-135M decode step, CPU time, best of 15 interleaved on a loaded host: float grouped
9.2 ms, int16 6.7 ms, int8 weights 10.6 ms; inside decode (cProfile, 32 tokens) 1.1-1.4 s
-> 0.5-0.9 s.  Row groups of 8 or 16 (144 or 288 lanes) measured no better than 4.
The converter now writes the dot layout instead where 16 divides the rows (dot_jit.py: four
bytes of a row per 32-bit lane, 4-way integer dot products, 2-4x ``_int4_grouped_q8``); the
kernels here serve the row-grouped packages written before it and matrices 16 does not divide.
``fastmath`` lets the row sums
reassociate (that is what vectorises a float reduction); results differ from the numpy kernel
by float32 rounding of the sums only (tests/engine/llm/test_gemv.py bounds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import types

from engine import jit
from engine.llm.gemv import DOT_GROUP, gemm_int4, quantize_activations, tile_rows

_F32, _I64 = types.float32, types.int64
_X = jit.array(_F32, 1, "C", readonly=True)
_OUT = jit.array(_F32, 1, "C")
_INT4 = types.void(
    _X,
    jit.array(types.uint8, 2, "C", readonly=True),
    jit.array(_F32, 2, "C", readonly=True),
    _I64,
    _OUT,
)
_INT8 = types.void(
    _X, jit.array(types.int8, 2, "C", readonly=True), jit.array(_F32, 1, "C", readonly=True), _OUT
)
_INT4_GROUPED = types.void(
    _X,
    jit.array(types.uint8, 3, "C", readonly=True),
    jit.array(_F32, 2, "C", readonly=True),
    _I64,
    _I64,
    _OUT,
)
_PART = 16  # bytes per int16 accumulator: 32 values, |sum| <= 32 * 8 * 127 < 2**15
_FAST = {"nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"}


@jit.njit([types.void(_X, _I64, jit.array(_F32, 1, "C"), jit.array(_F32, 1, "C"), jit.array(_F32, 1, "C"))])
def _prepare(x, block, low_x, mixed_x, xsum):  # noqa: ANN001, ANN202
    """Per call: x's low halves per block, xh - 16 xl beside them, and each block's sum of x."""
    half = block // 2
    for b in range(xsum.shape[0]):
        total = np.float32(0.0)
        for j in range(half):
            low, high = x[b * block + j], x[b * block + half + j]
            low_x[b * half + j] = low
            mixed_x[b * half + j] = high - np.float32(16.0) * low
            total += low + high
        xsum[b] = total


# One thread: numba's parallel launches (prange on the workqueue pool) measured 1.6 -> 5.2 ms
# on the LM head and 21 us -> 4 ms on q/k/v at 2 threads, erratically, so decode at 2 threads
# ran slower than at 1; the row loops stay serial until a launch costs less than a GEMV.  The
# row loop is written out in each kernel: a helper per row, called or inlined, lost the
# vectorised reduction (2-3x slower).
@jit.njit([_INT4], fastmath=_FAST)
def _int4_serial(x, packed, scale, block, out):  # noqa: ANN001, ANN202
    half = block // 2
    blocks = scale.shape[1]
    low_x = np.empty(blocks * half, np.float32)
    mixed_x = np.empty(blocks * half, np.float32)
    xsum = np.empty(blocks, np.float32)
    _prepare(x, block, low_x, mixed_x, xsum)
    for n in range(packed.shape[0]):
        row = packed[n]
        acc = np.float32(0.0)
        for b in range(blocks):
            bytes_ = row[b * half : (b + 1) * half]
            low = low_x[b * half : (b + 1) * half]
            mixed = mixed_x[b * half : (b + 1) * half]
            s = np.float32(0.0)
            for j in range(half):
                # byte v = lo + 16 hi: lo * xl + hi * xh = v * xl + floor(v / 16) * (xh - 16 xl),
                # all in float32 (16 lanes; numba's integer ops would widen to int64, 8 lanes)
                value = np.float32(bytes_[j])
                s += value * low[j] + np.floor(value * np.float32(0.0625)) * mixed[j]
            acc += (s - np.float32(8.0) * xsum[b]) * scale[n, b]
        out[n] = acc


_QUANTIZE_X = types.void(
    _X,
    _I64,
    _I64,
    jit.array(types.int16, 2, "C"),
    jit.array(types.int16, 2, "C"),
    jit.array(types.int16, 2, "C"),
    jit.array(_F32, 1, "C"),
)


@jit.njit([_QUANTIZE_X], fastmath=_FAST)
def _quantize_x(x, block, group, low_x, high_x, start, dx):  # noqa: ANN001, ANN202
    """x as int8 values per block (llama.cpp's q8_0 rule: d = max |x| / 127, round(x / d)),
    held in int16 and tiled per lane like the grouped weights: lane g * blocks + b of byte j
    meets low_x[j, lane] = xq[b * B + j] and high_x[j, lane] = xq[b * B + B/2 + j].
    start[part, lane] = -8 * (the sum of the xq a part's 16 bytes meet): the accumulator's
    initial value, which takes the nibbles' +8 out; dx[b] = the block's d."""
    half = block // 2
    blocks = dx.shape[0]
    for b in range(blocks):
        base = b * block
        largest = np.float32(0.0)
        for j in range(block):
            largest = max(largest, abs(x[base + j]))
        dx[b] = largest / np.float32(127.0)
        inverse = np.float32(127.0) / largest if largest > 0 else np.float32(0.0)
        for part in range(half // _PART):
            total = 0
            for j in range(part * _PART, (part + 1) * _PART):
                low = np.int16(np.rint(x[base + j] * inverse))
                high = np.int16(np.rint(x[base + half + j] * inverse))
                total += low + high
                for g in range(group):
                    low_x[j, g * blocks + b] = low
                    high_x[j, g * blocks + b] = high
            for g in range(group):
                start[part, g * blocks + b] = np.int16(-8 * total)


@jit.njit([_INT4_GROUPED], fastmath=_FAST)
def _int4_grouped(x, packed, scale, block, group, out):  # noqa: ANN001, ANN202
    """The row-grouped layout (gemv.py): packed [N/G, B/2, G * blocks].  The inner loop runs
    across a group's G * blocks lanes, one float32 accumulator per (row, block); the scales and
    the -8 offset are applied once per (row, block) after the byte loop."""
    groups, half, lanes = packed.shape
    blocks = lanes // group
    # x per lane, tiled G times: lane g * blocks + b of byte j meets x[b * B + j] (low nibble)
    low_x = np.empty((half, lanes), np.float32)
    mixed_x = np.empty((half, lanes), np.float32)
    xsum = np.zeros(blocks, np.float32)
    for b in range(blocks):
        for j in range(half):
            low, high = x[b * block + j], x[b * block + half + j]
            xsum[b] += low + high
            for g in range(group):
                low_x[j, g * blocks + b] = low
                mixed_x[j, g * blocks + b] = high - np.float32(16.0) * low
    acc = np.empty(lanes, np.float32)
    for i in range(groups):
        for lane in range(lanes):
            acc[lane] = 0.0
        for j in range(half):
            bytes_, low, mixed = packed[i, j], low_x[j], mixed_x[j]
            for lane in range(lanes):
                value = np.float32(bytes_[lane])
                acc[lane] += value * low[lane] + np.floor(value * np.float32(0.0625)) * mixed[lane]
        for g in range(group):
            row = scale[i * group + g]
            s = np.float32(0.0)
            for b in range(blocks):
                s += (acc[g * blocks + b] - np.float32(8.0) * xsum[b]) * row[b]
            out[i * group + g] = s


_INT4_Q8 = types.void(
    _X,
    jit.array(types.uint8, 3, "C", readonly=True),
    jit.array(types.uint16, 2, "C", readonly=True),
    _I64,
    _I64,
    _OUT,
)


@jit.njit([_INT4_Q8], fastmath=_FAST)
def _int4_grouped_q8(x, packed, scale, block, group, out):  # noqa: ANN001, ANN202
    """The row-grouped layout (gemv.py): packed [N/G, B/2, G * blocks], x quantized to int8 per
    block (``_quantize_x``).  The inner loop runs across a group's G * blocks lanes in int16
    (32 lanes per AVX-512 vector): acc += low nibble * xl + high nibble * xh per byte, one
    accumulator per (row, block, part of 16 bytes).  int16 is exact here: the true sum
    sum((nibble - 8) * xq) over a part's 32 values is within 32 * 8 * 127 = 32512, and
    wrapping arithmetic mod 2**16 (the -8 folded into the start value) lands on it.  Each
    (row, block) then adds float(acc) * d_w * d_x, d_w read as float16 bits ([N/G, G * blocks]:
    a group's scales in lane order) and widened a group at a time: numba has no float16, so
    by the bits (sign, then exponent and mantissa shifted into float32's and scaled by 2**112,
    exact for normal and subnormal halves and zero; the converter stores no inf or nan)."""
    groups, half, lanes = packed.shape
    # the shapes say the group (the layer kernel passes one ``group`` for its four matrices,
    # whose groups may differ: gemv.choose_group)
    group = out.shape[0] // groups
    blocks = lanes // group
    parts = half // _PART
    low_x = np.empty((half, lanes), np.int16)
    high_x = np.empty((half, lanes), np.int16)
    start = np.empty((parts, lanes), np.int16)
    dx = np.empty(blocks, np.float32)
    _quantize_x(x, block, group, low_x, high_x, start, dx)
    acc = np.empty((parts, lanes), np.int16)
    total = np.empty(lanes, np.float32)
    bits = np.empty(lanes, np.uint32)
    widened = bits.view(np.float32)
    for i in range(groups):
        halves = scale[i]
        for lane in range(lanes):
            h = np.uint32(halves[lane])
            bits[lane] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)
        for part in range(parts):
            sums, begin = acc[part], start[part]
            for lane in range(lanes):
                sums[lane] = begin[lane]
            for j in range(part * _PART, (part + 1) * _PART):
                bytes_, low, high = packed[i, j], low_x[j], high_x[j]
                for lane in range(lanes):
                    v = np.int16(bytes_[lane])
                    sums[lane] = np.int16(sums[lane] + (v & 15) * low[lane] + (v >> 4) * high[lane])
        for lane in range(lanes):
            total[lane] = np.float32(acc[0, lane])
        for part in range(1, parts):
            for lane in range(lanes):
                total[lane] += np.float32(acc[part, lane])
        for g in range(group):
            s = np.float32(0.0)
            for b in range(blocks):
                s += total[g * blocks + b] * widened[g * blocks + b] * dx[b]
            out[i * group + g] = s * np.float32(2.0**112)


@jit.njit([_INT8], fastmath=_FAST)
def _int8_serial(x, q, scale, out):  # noqa: ANN001, ANN202
    for n in range(q.shape[0]):
        row = q[n]
        s = np.float32(0.0)
        for k in range(row.shape[0]):
            s += np.float32(row[k]) * x[k]
        out[n] = s * scale[n]


_DEQUANTIZE = types.void(
    jit.array(types.uint8, 3, "C", readonly=True),
    jit.array(_F32, 2, "C", readonly=True),
    _I64,
    _I64,
    jit.array(_F32, 2, "C"),
)


@jit.njit([_DEQUANTIZE])
def _dequantize_grouped(packed, scale, block, group, out):  # noqa: ANN001, ANN202
    """Whole row groups of the grouped layout -> float32 rows: packed [groups, B/2, G * blocks],
    scale [groups * G, blocks] float32, out [groups * G, K].  Prefill's tiles: numpy's
    to_standard + dequantize_int4 took a quarter of a 256-token int4 prefill (a transposing copy,
    then five passes over the tile); this is one.  No fastmath: (nibble - 8) * d rounds as
    numpy's does, so both paths give the same bits."""
    groups, half, lanes = packed.shape
    blocks = lanes // group
    for i in range(groups):
        for g in range(group):
            row = out[i * group + g]
            for b in range(blocks):
                d = scale[i * group + g, b]
                lane = g * blocks + b
                base = b * block
                for j in range(half):
                    v = packed[i, j, lane]
                    row[base + j] = (np.float32(v & 15) - np.float32(8.0)) * d
                    row[base + half + j] = (np.float32(v >> 4) - np.float32(8.0)) * d


@jit.njit([types.void(jit.array(_F32, 2, "C", readonly=True), _I64, jit.array(_F32, 2, "C"))])
def _round_activations(x, block, out):  # noqa: ANN001, ANN202
    """gemv.quantize_activations into ``out`` (the same float32 operations, so the same bits):
    four numpy passes and their temporaries over prefill's [M, K] activations become one."""
    for m in range(x.shape[0]):
        for base in range(0, x.shape[1], block):
            largest = np.float32(0.0)
            for j in range(base, base + block):
                largest = max(largest, abs(x[m, j]))
            if largest > 0:
                inverse = np.float32(127.0) / largest
                step = largest / np.float32(127.0)
            else:
                inverse, step = np.float32(0.0), np.float32(0.0)
            for j in range(base, base + block):
                out[m, j] = np.rint(x[m, j] * inverse) * step


def gemm_int4_jit(
    x: np.ndarray, packed: np.ndarray, scale: np.ndarray, block: int, group: int, activations: str
) -> np.ndarray:
    """gemv.gemm_int4 (prefill: x [M, K] times the int4 matrix's transpose -> [M, N]): in
    integers by prefill_jit.py where it applies (the converter's int4), else with the tiles
    dequantized by ``_dequantize_grouped`` (the same products as numpy's, bit for bit)."""
    if group == DOT_GROUP:  # 4-byte integer dot products (dot_jit.py)
        return jit.module("engine.llm.dot_jit").gemm(x, packed, scale, block)
    prefill = jit.module("engine.llm.prefill_jit")
    if prefill.supports(packed.shape[0], group, activations):  # integer products (prefill_jit.py)
        return prefill.gemm(x, packed, scale, block, group)
    if group == 1:
        return gemm_int4(x, packed, scale, block, group, activations)
    if activations == "int8":
        rounded = np.empty(x.shape, np.float32)
        _round_activations(np.ascontiguousarray(x, np.float32), block, rounded)
        x = rounded
    n, half_k = packed.shape
    grouped = np.asarray(packed).view(np.ndarray).reshape(n // group, block // 2, group * half_k * 2 // block)
    out = np.empty((x.shape[0], n), np.float32)
    step = tile_rows(half_k * 2, group)
    tile = np.empty((min(step, n), half_k * 2), np.float32)
    for start in range(0, n, step):
        rows = min(step, n - start)
        scales = np.ascontiguousarray(scale[start : start + rows], np.float32)
        first = start // group
        _dequantize_grouped(grouped[first : first + rows // group], scales, block, group, tile[:rows])
        np.matmul(x, tile[:rows].T, out=out[:, start : start + rows])
    return out


def gemv_int4_jit(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: x [K] float32, packed [N, K/2] uint8, scale [N, K/B] float32 or float16; attrs:
    block, group (1 when absent), activations ("float" when absent, or "int8": x quantized per
    block as llama.cpp's q8_0, the matrix's own setting, gemv.py) -> [N]."""
    x, packed, scale = inputs
    block, group = int(attrs["block"]), int(attrs.get("group", 1))
    out = np.empty(packed.shape[0], np.float32)
    x = np.ascontiguousarray(x, np.float32)
    quantized = attrs.get("activations", "float") == "int8"
    n, half_k = packed.shape
    if group == DOT_GROUP:  # the converter's int4 matrices (dot_jit.py)
        k = half_k * 2
        scratch = np.empty(k, np.int8), np.empty(k // 32, np.int32), np.empty(k // 32, np.float32)
        w, halves = packed.reshape(-1), scale.view(np.uint16).reshape(-1)
        dot = jit.module("engine.llm.dot_jit")
        dot.spread_gemv(dot.gemv_dot, dot.gemv_dot_parallel, x, w, halves, block, *scratch, out)
        return [out]
    if group > 1 and quantized and scale.dtype == np.float16:  # 4 or 8 rows per group
        grouped = packed.reshape(n // group, block // 2, group * half_k * 2 // block)
        halves = scale.view(np.uint16).reshape(n // group, grouped.shape[2])
        _int4_grouped_q8(x, grouped, halves, block, group, out)
        return [out]
    if quantized:
        x = quantize_activations(x[None, :], block)[0]
    scale = np.ascontiguousarray(scale, np.float32)
    if group == 1:
        _int4_serial(x, packed, scale, block, out)
    else:
        grouped = packed.reshape(n // group, block // 2, group * half_k * 2 // block)
        _int4_grouped(x, grouped, scale, block, group, out)
    return [out]


def gemv_int8_jit(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: x [K] float32, q [N, K] int8, scale [N] float32 -> [N]; q uint8: the int8 dot
    layout (gemv.py), x rounded to int8 per block of 32 (dot_jit.py's 4-byte dot products)."""
    x, q, scale = inputs
    if q.dtype == np.uint8:
        return [jit.module("engine.llm.dot_jit").gemv8(x, q, scale)]
    out = np.empty(q.shape[0], np.float32)
    _int8_serial(np.ascontiguousarray(x, np.float32), q, scale, out)
    return [out]


gemv_int4_jit.jit = True  # type: ignore[attr-defined]
gemv_int8_jit.jit = True  # type: ignore[attr-defined]


def _int4(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Any]:
    return [gemv_int4_jit]


def _int8(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Any]:
    return [gemv_int8_jit]


CANDIDATES = {"LlmGemvInt4": _int4, "LlmGemvInt8": _int8}
