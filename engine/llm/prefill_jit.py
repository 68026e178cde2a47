"""Prefill's int4 GEMM in integers (numba): int4 weights x int8 activations, summed exactly in
int32 per block of 32 and scaled once per block, as llama.cpp's q4_0 x q8_0 products are.

BLAS on dequantized float32 tiles (gemv.py's ``gemm_int4``) tops out at the CPU's float FMA
rate, 16 products per AVX-512 instruction.  Here a tile of weights is widened once to int16
values (nibble - 8) in pairs of adjacent inputs, the activations are rounded to int8 per block
(llama.cpp's q8_0 rule, the matrix's own ``activations: "int8"``) and held as int16 pairs, and
one instruction multiplies 16 rows by a pair of inputs and adds both products to each row's
int32 sum: 32 products (x86's vpmaddwd, vpdpwssd with AVX-512 VNNI).  numba has no vector
types, so ``_blocks`` writes that step in LLVM's generic vector IR (sign-extend, multiply, add
the even and odd lanes): LLVM lowers it to vpdpwssd/vpmaddwd on x86 and to its own widening
multiplies elsewhere, so nothing here is x86-only.  Four tokens share each weight load; with
more than one thread allowed (``jit.thread_limit``) a tile's vectors of rows spread over them.

256 tokens x 576 inputs x 3072 outputs, CPU time on the loaded 2-core host: OpenBLAS sgemm
10.4-12.0 ms, this 7.3-7.7 ms (int32 sums are exact; the float32 scaling adds one rounding
per block, the float path's sums round at every product).

Layouts (per tile of ``rows`` output rows, rows a multiple of 16):
- weights: int16 [rows/16, K/2, 16, 2], flat: element (v, p, lane, i) = w[16 v + lane, 2 p + i];
- their scales: float32 [rows/16, K/32, 16] (a block of 64 repeats its scale for both halves);
- activations: int16 [M padded to 4, K], flat; their scales float32 [M padded, K/32].
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from engine import jit

LANES = 16  # output rows per vector: 16 int32 sums in one AVX-512 register
TOKENS = 4  # tokens per step, sharing each load of weights
SUB = 32  # inputs per scaled sum (a block of 64 is two)
TILE_BYTES = 512 << 10  # int16 weights per tile: L2-resident while every token passes over them

_L16, _L32, _L64, _LF32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()  # LLVM's
_I64 = types.int64


def _at(context, builder, array_type, array, offset):  # noqa: ANN001, ANN202
    """Pointer to element ``offset`` of a flat numba array."""
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])


def _splat(builder, value, vector):  # noqa: ANN001, ANN202
    undefined = ir.Constant(vector, ir.Undefined)
    first = builder.insert_element(undefined, value, ir.Constant(_L32, 0))
    return builder.shuffle_vector(first, undefined, ir.Constant(ir.VectorType(_L32, vector.count), None))


@intrinsic
def _blocks(typingctx, w, w_at, x, x_at, x_stride, s, s_at, dx, dx_at, dx_stride, out, out_at, out_stride):  # noqa: ANN001, ANN202, ARG001, E501
    """out[t, 0:16] += float(sum over one block of 32 inputs of w[rows, k] * x[t, k]) * s[0:16]
    * dx[t] for TOKENS tokens t (rows ``x_stride``/``dx_stride``/``out_stride`` apart)."""
    sig = types.void(w, w_at, x, x_at, x_stride, s, s_at, dx, dx_at, dx_stride, out, out_at, out_stride)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        w, w_at, x, x_at, x_stride, s, s_at, dx, dx_at, dx_stride, out, out_at, out_stride = args
        w_type, _, x_type, _, _, s_type, _, dx_type, _, _, out_type, _, _ = signature.args
        pairs16, wide = ir.VectorType(_L16, 2 * LANES), ir.VectorType(_L32, 2 * LANES)
        sums, floats = ir.VectorType(_L32, LANES), ir.VectorType(_LF32, LANES)
        even = ir.Constant(sums, [2 * i for i in range(LANES)])
        odd = ir.Constant(sums, [2 * i + 1 for i in range(LANES)])

        def row(base, stride, t):  # noqa: ANN001, ANN202
            return builder.add(base, builder.mul(stride, ir.Constant(_L64, t)))

        weights = _at(context, builder, w_type, w, w_at)
        # x as int32: each holds a pair of int16 inputs, broadcast to all 16 lanes per step
        inputs = [
            builder.bitcast(_at(context, builder, x_type, x, row(x_at, x_stride, t)), _L32.as_pointer())
            for t in range(TOKENS)
        ]
        acc = [ir.Constant(sums, None) for _ in range(TOKENS)]
        for p in range(SUB // 2):
            address = builder.gep(weights, [ir.Constant(_L64, 2 * LANES * p)])
            pair = builder.sext(builder.load(builder.bitcast(address, pairs16.as_pointer()), align=2), wide)
            for t in range(TOKENS):
                value = builder.load(builder.gep(inputs[t], [ir.Constant(_L64, p)]), align=2)
                both = builder.bitcast(_splat(builder, value, sums), pairs16)
                product = builder.mul(pair, builder.sext(both, wide))
                undefined = ir.Constant(wide, ir.Undefined)
                added = builder.add(
                    builder.shuffle_vector(product, undefined, even),
                    builder.shuffle_vector(product, undefined, odd),
                )
                acc[t] = builder.add(acc[t], added)
        address = _at(context, builder, s_type, s, s_at)
        scales = builder.load(builder.bitcast(address, floats.as_pointer()), align=4)
        for t in range(TOKENS):
            d = builder.load(_at(context, builder, dx_type, dx, row(dx_at, dx_stride, t)))
            step = builder.fmul(scales, _splat(builder, d, floats))
            target = builder.bitcast(
                _at(context, builder, out_type, out, row(out_at, out_stride, t)), floats.as_pointer()
            )
            total = builder.fadd(
                builder.load(target, align=4), builder.fmul(builder.sitofp(acc[t], floats), step)
            )
            builder.store(total, target, align=4)
        return context.get_dummy_value()

    return sig, codegen


_FLAT16, _FLAT32 = jit.array(types.int16, 1, "C"), jit.array(types.float32, 1, "C")
_IN16, _IN32 = jit.array(types.int16, 1, "C", readonly=True), jit.array(types.float32, 1, "C", readonly=True)


_TILE = [types.void(_IN16, _IN32, _I64, _I64, _IN16, _IN32, _I64, _I64, _FLAT32, _I64)]


@numba.njit(inline="always", cache=True)
def _vector(xq, dx, tokens, k, wq, ws, v, n0, out, n):  # noqa: ANN001, ANN202
    """Output rows 16 v .. 16 v + 15 of the tile for every token."""
    pairs, subs = k // 2, k // SUB
    for t in range(0, tokens, TOKENS):
        for b in range(subs):
            w_at = (v * pairs + b * (SUB // 2)) * 2 * LANES
            s_at = (v * subs + b) * LANES
            out_at = t * n + n0 + v * LANES
            _blocks(wq, w_at, xq, t * k + b * SUB, k, ws, s_at, dx, t * subs + b, subs, out, out_at, n)


@jit.njit(_TILE)
def _gemm_tile(xq, dx, tokens, k, wq, ws, rows, n0, out, n):  # noqa: ANN001, ANN202
    """out[t, n0 + r] += the tile's products for every token t (``tokens`` a multiple of 4),
    r < rows; out is [tokens, n] flat."""
    for v in range(rows // LANES):
        _vector(xq, dx, tokens, k, wq, ws, v, n0, out, n)


@jit.njit(_TILE, parallel=True)
def _gemm_tile_parallel(xq, dx, tokens, k, wq, ws, rows, n0, out, n):  # noqa: ANN001, ANN202
    """``_gemm_tile`` with its vectors of 16 rows spread over threads (each writes its own
    columns, in the same order: the same bits).  One launch per tile, ~30 per GEMM at most."""
    for v in prange(rows // LANES):
        _vector(xq, dx, tokens, k, wq, ws, v, n0, out, n)


_PACK = types.void(
    jit.array(types.uint8, 3, "C", readonly=True),
    jit.array(types.float32, 2, "C", readonly=True),
    _I64,
    _I64,
    _FLAT16,
    _FLAT32,
)


@jit.njit([_PACK])
def _pack_weights(packed, scale, block, group, wq, ws):  # noqa: ANN001, ANN202
    """Whole row groups of gemv.py's grouped int4 layout (packed [groups, B/2, G * blocks], scale
    [rows, blocks] float32) -> the tile layouts above."""
    groups, half, lanes = packed.shape
    blocks = lanes // group
    k = blocks * block
    pairs, subs = k // 2, k // SUB
    for i in range(groups):
        for g in range(group):
            r = i * group + g
            v, lane = r // LANES, r % LANES
            base = v * pairs * 2 * LANES + lane * 2
            for b in range(blocks):
                column = g * blocks + b
                for j in range(half):
                    byte = packed[i, j, column]
                    low, high = b * block + j, b * block + half + j
                    wq[base + (low // 2) * 2 * LANES + low % 2] = np.int16(byte & 15) - 8
                    wq[base + (high // 2) * 2 * LANES + high % 2] = np.int16(byte >> 4) - 8
                for part in range(block // SUB):
                    ws[(v * subs + b * (block // SUB) + part) * LANES + lane] = scale[r, b]


@jit.njit([types.void(jit.array(types.float32, 2, "C", readonly=True), _I64, _FLAT16, _FLAT32)])
def _pack_activations(x, block, xq, dx):  # noqa: ANN001, ANN202
    """x [M, K] rounded per block of ``block`` as gemv.quantize_activations rounds it: xq int16
    [M padded, K] flat (padding rows left zero by the caller), dx [M padded, K/32] flat."""
    m, k = x.shape
    subs = k // SUB
    for t in range(m):
        for base in range(0, k, block):
            largest = np.float32(0.0)
            for j in range(base, base + block):
                largest = max(largest, abs(x[t, j]))
            inverse = np.float32(127.0) / largest if largest > 0 else np.float32(0.0)
            step = largest / np.float32(127.0) if largest > 0 else np.float32(0.0)
            for j in range(base, base + block):
                xq[t * k + j] = np.int16(np.rint(x[t, j] * inverse))
            for part in range(block // SUB):
                dx[t * subs + base // SUB + part] = step


def supports(n: int, group: int, activations: str) -> bool:
    """Whether ``gemm`` takes this int4 matrix: the row-grouped layout (4 or 8 rows; the dot
    layout's 16 has its own, dot_jit.py), int8 activations, and whole vectors of 16 rows."""
    return activations == "int8" and 1 < group < LANES and n % LANES == 0 and LANES % group == 0


def gemm(x: np.ndarray, packed: np.ndarray, scale: np.ndarray, block: int, group: int) -> np.ndarray:
    """x [M, K] float32 times the int4 matrix's transpose -> [M, N] (``supports`` must hold):
    x rounded to int8 per block as gemv.quantize_activations does, the products summed in
    int32 per block of 32 and scaled per block."""
    m, k = x.shape
    n = packed.shape[0]
    padded = -(-m // TOKENS) * TOKENS
    xq = np.zeros(padded * k, np.int16)
    dx = np.zeros(padded * (k // SUB), np.float32)
    _pack_activations(np.ascontiguousarray(x, np.float32), block, xq, dx)
    out = np.zeros(padded * n, np.float32)
    rows = max(LANES, TILE_BYTES // (2 * k) // LANES * LANES)
    wq = np.empty(min(rows, n) * k, np.int16)
    ws = np.empty(min(rows, n) * (k // SUB), np.float32)
    grouped = np.asarray(packed).view(np.ndarray).reshape(n // group, block // 2, group * k // block)
    for start in range(0, n, rows):
        count = min(rows, n - start)
        scales = np.ascontiguousarray(scale[start : start + count], np.float32)
        first = start // group
        _pack_weights(grouped[first : first + count // group], scales, block, group, wq, ws)
        jit.run(_gemm_tile, _gemm_tile_parallel, xq, dx, padded, k, wq, ws, count, start, out, n)
    return out.reshape(padded, n)[:m]


# no kernel-layer op of its own: gemv_jit's prefill GEMM calls it (jit.module)
CANDIDATES: dict = {}
