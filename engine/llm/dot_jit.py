"""int4 x int8 GEMV and GEMM on the dot layout (gemv.py, ``DOT_GROUP`` rows): four-byte dot
products, as llama.cpp's q4_0 x q8_0 and x86's vpdpbusd compute them.

The row-grouped layouts (G = 4, 8) give every (row, block) its own int16 lane, so each weight
costs a widen, a multiply and an add of its own (7 instructions per 64 weights, ~15-18 G
weights/s hot in L2 on one core).  The dot layout keeps four consecutive bytes of one row's
block in each 32-bit lane, 16 rows per 64 bytes: a lane's low nibbles are four weights, its high
nibbles the four B/2 further on.  Per 64 bytes (128 weights) a step is one load, two masks
(``v & 0x0F`` and ``v & 0xF0``: the high nibbles stay 16x, summed apart and shifted down
once per block: exact, the sums are whole multiples of 16) and two 4-way dot products of
unsigned weight bytes with the block's int8 activations broadcast to every lane, summed into
16 int32 lanes.  The nibbles' +8 is taken out by starting a block's sum at -8 * (the sum of its
activations), once per call.  A block then adds float(sum) * d_w[16 rows] * d_x to 16 float
sums: its scales are stored 16 rows side by side, read as float16 and widened by LLVM
(vcvtph2ps).

The dot product is written in LLVM IR (numba has no vector types): with AVX-512 VNNI it is
the vpdpbusd instruction; with AVX2 (AMD Zen 2/3, no VNNI) vpmaddubsw on bounded bytes
(int_dot_ir.dot_small for the nibbles, dot_signed for int8: 11-13x the generic IR's tokens/s
in prefill, 1.7-3x in decode on smollm2-135m, within 0.97-1.23x of llama.cpp's q4_0/q8_0);
elsewhere generic IR (widen, multiply, add the four products of a lane) that LLVM lowers for
the target, so nothing here needs x86 (tests pass compiled with NUMBA_CPU_NAME=skylake-avx512,
which has no VNNI, and haswell).  Prefill runs the same step for eight
tokens per weight load (``gemm``): the unpacked weights are shared (eight took 256 tokens x
3072 x 576 from 12.1 to 6.1-7.3 ms against four; sixteen measured slower, 8.4).

Measured (one core of the shared host, CPU time per call, best of 7, against the int16 kernel
on the 8- or 4-row layout): 3072 x 576 109 -> 29 us, 576 x 1536 44 -> 21 us, the 49152 x 576
LM head 2.6 -> 0.77 ms (20.6 GB/s of weights, at the memory's pace); 256 tokens through
prefill's integer GEMM (prefill_jit.py's, same run): 960 x 576 5.7 -> 2.9 ms, 3072 x 576
17.4 -> 8.7 ms, 576 x 1536 10.2 -> 4.9 ms, the same bits (both sum exactly per 32 weights and
scale once).  Then the token groups moved outside the sub-block loop (``_rows``), so 8 tokens'
sums stay in L1 across a vector's sub-blocks instead of 8 rows N * 4 bytes apart being
revisited per sub-block: 3072 x 576 8.6 -> 2.4 ms, 576 x 1536 1.6 -> 1.35, the same bits.

int8 weights run the same way (``gemv_dot8``/``gemm8``, below): q8_0 x q8_0's arithmetic.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from engine import jit
from engine.llm import gemv
from engine.ops import int_dot_ir

LANES = 16  # rows per step: 16 int32 sums in one 512-bit vector
SUB = gemv.DOT_SUB  # weights per row per step: 16 bytes, 4 lanes' worth of 4 bytes
TOKENS = gemv.DOT_TOKENS  # prefill: tokens per weight load (see above)

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32, _HALF = ir.FloatType(), ir.HalfType()
_SUMS = ir.VectorType(_I32, LANES)
_FLOATS = ir.VectorType(_F32, LANES)


VNNI = int_dot_ir.VNNI
# AVX2 without VNNI: the int4 step sums its nibble products in 16 bits (int_dot_ir.dot_small),
# the high nibbles shifted down first (VNNI and the generic IR keep them 16x: one mask); the
# int8 step multiplies signed by signed bytes (int_dot_ir.dot_signed), no +128 to take out
SMALL = int_dot_ir.PATH == "avx2"
_splat, _dot, _at = int_dot_ir.splat, int_dot_ir.dot, int_dot_ir.pointer


def _make_step(count: int):  # noqa: ANN202
    """The step intrinsic for ``count`` tokens (1: decode, TOKENS: prefill)."""

    @intrinsic
    def step(
        typingctx, w, w_at, s, s_at, xq, x_at, half, x_stride, off, dx, at, subs, out, out_at, out_stride
    ):  # noqa: ANN001, ANN202, ARG001, E501
        """For ``count`` tokens t: out[out_at + t * out_stride + (0..15)] (16 rows) += float(the
        sub-block's int sum) * scales[16 rows] * dx[at + t * subs]: weight bytes w[w_at : w_at +
        256] (4 chunks of 16 rows x 4 bytes), float16 scales s[s_at : s_at + 16], activations
        xq[x_at + t * x_stride + (0..15)] (low nibbles) and + half (high), the int sum started
        at off[at + t * subs]."""
        sig = types.void(
            w, w_at, s, s_at, xq, x_at, half, x_stride, off, dx, at, subs, out, out_at, out_stride
        )

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            w, w_at, s, s_at, xq, x_at, half, x_stride, off, dx, at, subs, out, out_at, out_stride = args
            kinds = signature.args

            def row(base, stride, t):  # noqa: ANN001, ANN202
                return builder.add(base, builder.mul(stride, ir.Constant(_I64, t)))

            def load(kind, array, offset, element, align):  # noqa: ANN001, ANN202
                return builder.load(_at(context, builder, kind, array, offset, element), align=align)

            lows, highs = [], []
            nibbles = ir.Constant(_SUMS, [0x0F0F0F0F] * LANES)
            for c in range(4):  # the weights once, for every token
                chunk = load(kinds[0], w, builder.add(w_at, ir.Constant(_I64, 4 * LANES * c)), _SUMS, 1)
                lows.append(builder.and_(chunk, nibbles))
                if SMALL:  # shifted down: dot_small wants bytes <= 15
                    highs.append(builder.and_(builder.lshr(chunk, ir.Constant(_SUMS, [4] * LANES)), nibbles))
                else:
                    highs.append(builder.and_(chunk, ir.Constant(_SUMS, [0xF0F0F0F0 - (1 << 32)] * LANES)))
            halves = load(kinds[2], s, s_at, ir.VectorType(_I16, LANES), 2)
            scales = builder.fpext(builder.bitcast(halves, ir.VectorType(_HALF, LANES)), _FLOATS)
            for t in range(count):
                x, index = row(x_at, x_stride, t), row(at, subs, t)
                start = _splat(builder, load(kinds[8], off, index, _I32, 4), _SUMS)
                values = []
                for c in range(4):
                    x_c = builder.add(x, ir.Constant(_I64, 4 * c))
                    values.append(_splat(builder, load(kinds[4], xq, x_c, _I32, 1), _SUMS))
                    values.append(_splat(builder, load(kinds[4], xq, builder.add(x_c, half), _I32, 1), _SUMS))
                if SMALL:  # all 8 products summed in 16 bits (int_dot_ir.dot_small)
                    pairs = [(lows[c // 2] if c % 2 == 0 else highs[c // 2], values[c]) for c in range(8)]
                    total = int_dot_ir.dot_small(builder, start, pairs)
                else:
                    low, high = start, ir.Constant(_SUMS, None)
                    for c in range(4):
                        low = _dot(builder, low, lows[c], values[2 * c])
                        high = _dot(builder, high, highs[c], values[2 * c + 1])
                    # the high nibbles were summed 16x: an exact shift (every sum a multiple of 16)
                    total = builder.add(low, builder.ashr(high, ir.Constant(_SUMS, [4] * LANES)))
                step = builder.fmul(scales, _splat(builder, load(kinds[9], dx, index, _F32, 4), _FLOATS))
                target = _at(context, builder, kinds[12], out, row(out_at, out_stride, t), _FLOATS)
                added = builder.fmul(builder.sitofp(total, _FLOATS), step)
                builder.store(builder.fadd(builder.load(target, align=4), added), target, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return step


_step1, _step_many = _make_step(1), _make_step(TOKENS)
_W = jit.array(types.uint8, 1, "C", readonly=True)
_S = jit.array(types.uint16, 1, "C", readonly=True)
_XQ, _OFF, _DX = (
    jit.array(types.int8, 1, "C"),
    jit.array(types.int32, 1, "C"),
    jit.array(types.float32, 1, "C"),
)
_X = jit.array(types.float32, 1, "C", readonly=True)
_N = types.int64


@numba.njit(inline="always", cache=True)
def _largest(block, lanes):  # noqa: ANN001, ANN202
    """max |block|, 16 lanes wide then halved 4 times: a serial maximum is a chain of dependent
    compares (~4 cycles each) that LLVM would not vectorise (2x slower)."""
    for j in range(16):
        lanes[j] = abs(block[j])
    for c in range(16, block.size, 16):
        chunk = block[c : c + 16]
        for j in range(16):
            a = abs(chunk[j])
            lanes[j] = a if a > lanes[j] else lanes[j]
    width = 8
    while width:
        for j in range(width):
            lanes[j] = lanes[j + width] if lanes[j + width] > lanes[j] else lanes[j]
        width //= 2
    return lanes[0]


@jit.njit([types.void(_X, _N, _N, _XQ, _OFF, _DX)])
def _activations(x, tokens, block, xq, off, dx):  # noqa: ANN001, ANN202
    """x [tokens, K] flat -> int8 per block (llama.cpp's q8_0 rule, gemv.quantize_activations':
    d = max |x| / 127, round(x * 127 / max |x|)) into xq [tokens, K]; per sub-block of 32
    weights (K/32 per token) dx = its block's d and off = -8 * (the sum of the xq its
    nibbles meet: 16 from the low half of the block, 16 from the high), the nibbles' +8."""
    k = x.size // tokens
    subs, per, half = k // SUB, block // SUB, block // 2
    lanes = np.empty(16, np.float32)
    for t in range(tokens):
        for b in range(k // block):
            base = t * k + b * block
            largest = _largest(x[base : base + block], lanes)
            inverse = np.float32(127.0) / largest if largest > 0 else np.float32(0.0)
            for p in range(per):
                total = np.int32(0)
                # 16-value slices, indexed from 0: ``x[low_at + j]`` with an offset numba cannot
                # prove non-negative took a wraparound check per value (1.3-1.9x the time)
                low_at = base + 16 * p
                x_low, x_high = x[low_at : low_at + 16], x[low_at + half : low_at + half + 16]
                q_low, q_high = xq[low_at : low_at + 16], xq[low_at + half : low_at + half + 16]
                for j in range(16):
                    low = np.int32(np.rint(x_low[j] * inverse))
                    high = np.int32(np.rint(x_high[j] * inverse))
                    q_low[j] = low
                    q_high[j] = high
                    total += low + high
                off[t * subs + b * per + p] = -8 * total
                dx[t * subs + b * per + p] = largest / np.float32(127.0)


@numba.njit(inline="always", cache=True)
def _rows(w, s, block, xq, off, dx, k, v, out, out_at, tokens, out_stride):  # noqa: ANN001, ANN202
    """Rows 16 v .. 16 v + 15 for ``tokens`` tokens (1, or a multiple of TOKENS)."""
    subs, per, half = k // SUB, block // SUB, block // 2
    # prefill: tokens outside the sub-blocks, as ``_rows8`` (the same sums in the same order);
    # blocks and their sub-blocks as two loops: ``sub // per`` and ``sub % per`` with ``per``
    # known only at run time were two integer divisions (~25 cycles each) per step
    for t in range(0, tokens, TOKENS):  # t = 0 only for decode's one token
        for b in range(k // block):
            s_at = (v * (k // block) + b) * LANES
            for p in range(per):
                sub = b * per + p
                w_at, x_at = (v * subs + sub) * 256, b * block + 16 * p
                if tokens == 1:
                    _step1(w, w_at, s, s_at, xq, x_at, half, k, off, dx, sub, subs, out, out_at, 0)
                else:
                    x_t, at, o = x_at + t * k, sub + t * subs, out_at + t * out_stride
                    _step_many(w, w_at, s, s_at, xq, x_t, half, k, off, dx, at, subs, out, o, out_stride)


@numba.njit(inline="always", cache=True)
def _gemv_vector(w, s, block, xq, off, dx, k, v, out):  # noqa: ANN001, ANN202
    """out[16 v .. 16 v + 15] = those rows of W x for one token, x already rounded into xq,
    off and dx (``_activations``): a GEMV's unit of work, serial or shared out."""
    for i in range(LANES):
        out[v * LANES + i] = 0.0
    _rows(w, s, block, xq, off, dx, k, v, out, v * LANES, 1, 0)


_GEMV = types.void(_X, _W, _S, _N, _XQ, _OFF, _DX, jit.array(types.float32, 1, "C"))


@jit.njit([_GEMV])
def gemv_dot(x, w, s, block, xq, off, dx, out):  # noqa: ANN001, ANN202
    """out [N] = W x for the dot layout (w [N * K/2] uint8, s [N * K/B] float16 bits, both in the
    layout's order); xq [K], off and dx [K/32]: scratch."""
    k = x.size
    _activations(x, 1, block, xq, off, dx)
    for v in range(out.size // LANES):
        _gemv_vector(w, s, block, xq, off, dx, k, v, out)


_GEMM = types.void(_XQ, _OFF, _DX, _N, _N, _W, _S, _N, jit.array(types.float32, 1, "C"))


@jit.njit([_GEMM])
def _gemm(xq, off, dx, tokens, k, w, s, block, out):  # noqa: ANN001, ANN202
    """out [tokens, N] flat += the products (out zeroed by the caller; tokens a multiple of 4)."""
    n = out.size // tokens
    for v in range(n // LANES):
        _rows(w, s, block, xq, off, dx, k, v, out, v * LANES, tokens, n)


@jit.njit([_GEMM], parallel=True)
def _gemm_parallel(xq, off, dx, tokens, k, w, s, block, out):  # noqa: ANN001, ANN202
    """``_gemm`` with its vectors of 16 rows spread over threads (each writes its own columns in
    the same order: the same bits)."""
    n = out.size // tokens
    for v in prange(n // LANES):
        _rows(w, s, block, xq, off, dx, k, v, out, v * LANES, tokens, n)


def gemm(x: np.ndarray, packed: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    """x [M, K] float32 times the dot-layout int4 matrix's transpose -> [M, N]: x rounded to int8
    per block as gemv.quantize_activations does, summed exactly per 32 weights, scaled per block."""
    m, k = x.shape
    n = packed.shape[0]
    padded, xq, off, dx = _rounded(x, block)
    out = np.zeros(padded * n, np.float32)
    w = np.asarray(packed).view(np.ndarray).reshape(-1)
    s = np.asarray(scale).view(np.uint16).view(np.ndarray).reshape(-1)
    jit.run(_gemm, _gemm_parallel, xq, off, dx, padded, k, w, s, block, out)
    return out.reshape(padded, n)[:m]


# ---- int8 per-channel weights on the dot layout (gemv.py's ``int8_to_dot``): q8_0 x q8_0's
# arithmetic with one scale per row.  The float kernel (gemv_jit's ``_int8_serial``) widened
# every weight to float32 (~0.95x llama.cpp's q8_0 at 1 thread); here each 64-byte load is 16
# rows x 4 bytes, one 4-way dot product per load against 4 int8 activations.  vpdpbusd wants
# one side unsigned: the weights are stored as q + 128 (1..255), and the 128 is taken out by
# starting a sub-block's sum at -128 * (the sum of its 32 activations) = 16 * ``_activations``'
# -8 * sum at block 32 (its xq in plain order then: the low half is x[0:16], the high x[16:32]).
# Sums are exact in int32 (|sum| <= 32 * 255 * 127); each sub-block adds float(sum) * d_x to 16
# float sums, and the rows' scales multiply them once at the end.
BLOCK8 = gemv.DOT_BLOCK8  # activations rounded per block of 32 (q8_0's), K a multiple of it
CHUNKS8 = BLOCK8 // 4  # 64-byte loads per sub-block and vector of 16 rows


def _make_step8(count: int):  # noqa: ANN202
    """The int8 step intrinsic for ``count`` tokens (1: decode, TOKENS: prefill)."""

    @intrinsic
    def step8(typingctx, w, w_at, xq, x_at, x_stride, off, dx, at, subs, out, out_at, out_stride):  # noqa: ANN001, ANN202, ARG001, E501
        """For ``count`` tokens t: out[out_at + t * out_stride + (0..15)] (16 rows) += float(the
        sub-block's int sum) * dx[at + t * subs]: weight bytes w[w_at : w_at + 512] (8 chunks of
        16 rows x 4 bytes, q + 128), activations xq[x_at + t * x_stride + (0..31)], the sum
        started at 16 * off[at + t * subs]."""
        sig = types.void(w, w_at, xq, x_at, x_stride, off, dx, at, subs, out, out_at, out_stride)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            w, w_at, xq, x_at, x_stride, off, dx, at, subs, out, out_at, out_stride = args
            kinds = signature.args

            def row(base, stride, t):  # noqa: ANN001, ANN202
                return builder.add(base, builder.mul(stride, ir.Constant(_I64, t)))

            def load(kind, array, offset, element, align):  # noqa: ANN001, ANN202
                return builder.load(_at(context, builder, kind, array, offset, element), align=align)

            chunks = [
                load(kinds[0], w, builder.add(w_at, ir.Constant(_I64, 4 * LANES * c)), _SUMS, 1)
                for c in range(CHUNKS8)
            ]
            if SMALL:  # AVX2: the weights' own signed bytes (q + 128 - 128), no offset to take out
                flip = ir.Constant(_SUMS, [0x80808080 - (1 << 32)] * LANES)
                chunks = [builder.xor(chunk, flip) for chunk in chunks]
            for t in range(count):
                x, index = row(x_at, x_stride, t), row(at, subs, t)
                # two chains of dependent dot products, not one: half the latency per sub-block
                sums = [ir.Constant(_SUMS, None)] * 2
                if not SMALL:  # the +128's share: 16 * off
                    start = _splat(builder, load(kinds[5], off, index, _I32, 4), _SUMS)
                    sums[0] = builder.shl(start, ir.Constant(_SUMS, [4] * LANES))
                for c in range(CHUNKS8):
                    x_c = builder.add(x, ir.Constant(_I64, 4 * c))
                    value = _splat(builder, load(kinds[2], xq, x_c, _I32, 1), _SUMS)
                    if SMALL:  # x in [-127, 127], the weights any int8
                        sums[c % 2] = int_dot_ir.dot_signed(builder, sums[c % 2], chunks[c], value)
                    else:
                        sums[c % 2] = _dot(builder, sums[c % 2], chunks[c], value)
                total = builder.add(sums[0], sums[1])
                d = _splat(builder, load(kinds[6], dx, index, _F32, 4), _FLOATS)
                target = _at(context, builder, kinds[9], out, row(out_at, out_stride, t), _FLOATS)
                added = builder.fmul(builder.sitofp(total, _FLOATS), d)
                builder.store(builder.fadd(builder.load(target, align=4), added), target, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return step8


_step8, _step8_many = _make_step8(1), _make_step8(TOKENS)
_SCALE8 = jit.array(types.float32, 1, "C", readonly=True)


@numba.njit(inline="always", cache=True)
def _rows8(w, scale, xq, off, dx, k, v, out, out_at, tokens, out_stride):  # noqa: ANN001, ANN202
    """Rows 16 v .. 16 v + 15 for ``tokens`` tokens (1, or a multiple of TOKENS), out zeroed
    there by the caller; the rows' scales applied after the last sub-block."""
    subs = k // SUB
    # tokens outside: 8 tokens' sums (8 x 64 bytes) stay in L1 across the sub-blocks, and the
    # vector's 16 x K bytes across the tokens (sub-blocks outside, prefill's 3072 x 576 at 256
    # tokens took 18 ms, 2.6 like this: a step's 8 rows of out lie N * 4 bytes apart)
    for t in range(0, tokens, TOKENS):  # t = 0 only for decode's one token
        for sub in range(subs):
            w_at, x_t, at, o = (
                (v * subs + sub) * 512,
                sub * SUB + t * k,
                sub + t * subs,
                out_at + t * out_stride,
            )
            if tokens == 1:
                _step8(w, w_at, xq, x_t, k, off, dx, at, subs, out, o, 0)
            else:
                _step8_many(w, w_at, xq, x_t, k, off, dx, at, subs, out, o, out_stride)
    for t in range(tokens):
        for i in range(LANES):
            out[out_at + t * out_stride + i] *= scale[v * LANES + i]


@numba.njit(inline="always", cache=True)
def _gemv_vector8(w, scale, xq, off, dx, k, v, out):  # noqa: ANN001, ANN202
    """``_gemv_vector`` for int8 weights on the dot layout."""
    for i in range(LANES):
        out[v * LANES + i] = 0.0
    _rows8(w, scale, xq, off, dx, k, v, out, v * LANES, 1, 0)


_GEMV8 = types.void(_X, _W, _SCALE8, _XQ, _OFF, _DX, jit.array(types.float32, 1, "C"))


@jit.njit([_GEMV8])
def gemv_dot8(x, w, scale, xq, off, dx, out):  # noqa: ANN001, ANN202
    """out [N] = W x for int8 weights on the dot layout (w [N * K] uint8 in the layout's order,
    scale [N] float32); xq [K], off and dx [K/32]: scratch."""
    k = x.size
    _activations(x, 1, BLOCK8, xq, off, dx)
    for v in range(out.size // LANES):
        _gemv_vector8(w, scale, xq, off, dx, k, v, out)


_GEMM8 = types.void(_XQ, _OFF, _DX, _N, _N, _W, _SCALE8, jit.array(types.float32, 1, "C"))


@jit.njit([_GEMM8])
def _gemm8(xq, off, dx, tokens, k, w, scale, out):  # noqa: ANN001, ANN202
    """out [tokens, N] flat = the products (out zeroed by the caller; tokens a multiple of 8)."""
    n = out.size // tokens
    for v in range(n // LANES):
        _rows8(w, scale, xq, off, dx, k, v, out, v * LANES, tokens, n)


@jit.njit([_GEMM8], parallel=True)
def _gemm8_parallel(xq, off, dx, tokens, k, w, scale, out):  # noqa: ANN001, ANN202
    """``_gemm8`` with its vectors of 16 rows spread over threads (the same bits)."""
    n = out.size // tokens
    for v in prange(n // LANES):
        _rows8(w, scale, xq, off, dx, k, v, out, v * LANES, tokens, n)


def _rounded(x: np.ndarray, block: int) -> tuple:
    """x [M, K] padded to whole steps of TOKENS rows and rounded per block (``_activations``):
    (rows padded, xq, off, dx)."""
    m, k = x.shape
    padded = -(-m // TOKENS) * TOKENS
    flat = np.zeros(padded * k, np.float32)
    flat[: m * k] = np.ascontiguousarray(x, np.float32).reshape(-1)
    xq = np.empty(padded * k, np.int8)
    off = np.empty(padded * (k // SUB), np.int32)
    dx = np.empty(padded * (k // SUB), np.float32)
    _activations(flat, padded, block, xq, off, dx)
    return padded, xq, off, dx


def gemm8(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x [M, K] float32 times the dot-layout int8 matrix's transpose -> [M, N]: x rounded to int8
    per block of 32 as gemv.quantize_activations does, summed exactly per 32 weights."""
    m, k = x.shape
    n = q.shape[0]
    padded, xq, off, dx = _rounded(x, BLOCK8)
    out = np.zeros(padded * n, np.float32)
    w = np.asarray(q).view(np.ndarray).reshape(-1)
    s = np.asarray(scale).view(np.ndarray)
    jit.run(_gemm8, _gemm8_parallel, xq, off, dx, padded, k, w, s, out)
    return out.reshape(padded, n)[:m]


def gemv8(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """W x for one float32 row x [K] and a dot-layout int8 matrix -> [N]."""
    k = x.size
    out = np.empty(q.shape[0], np.float32)
    scratch = np.empty(k, np.int8), np.empty(k // SUB, np.int32), np.empty(k // SUB, np.float32)
    w = np.asarray(q).view(np.ndarray).reshape(-1)
    x = np.ascontiguousarray(x, np.float32)
    spread_gemv(gemv_dot8, gemv_dot8_parallel, x, w, np.asarray(scale).view(np.ndarray), *scratch, out)
    return out


# ---- decode's large GEMVs (the LM head) with their vectors of 16 rows spread over threads
# (``spread_gemv``): the same sums in the same order as the serial twins, so the same bits.
# Only from PARALLEL_MIN_WEIGHTS up: a layer's GEMVs (~0.2 ms here) gained nothing on any of
# numba's layers (a launch and the second thread's wake-up cost as much), the 135M model's LM
# head (28 M weights) went 7.4 -> 4.1 ms at 2 threads (AMD EPYC, AVX2).
PARALLEL_MIN_WEIGHTS = 1 << 23


@jit.njit([_GEMV], parallel=True)
def gemv_dot_parallel(x, w, s, block, xq, off, dx, out):  # noqa: ANN001, ANN202
    """``gemv_dot`` on up to ``numba.get_num_threads()`` threads."""
    k = x.size
    _activations(x, 1, block, xq, off, dx)
    for v in prange(out.size // LANES):
        _gemv_vector(w, s, block, xq, off, dx, k, v, out)


@jit.njit([_GEMV8], parallel=True)
def gemv_dot8_parallel(x, w, scale, xq, off, dx, out):  # noqa: ANN001, ANN202
    """``gemv_dot8`` on up to ``numba.get_num_threads()`` threads."""
    k = x.size
    _activations(x, 1, BLOCK8, xq, off, dx)
    for v in prange(out.size // LANES):
        _gemv_vector8(w, scale, xq, off, dx, k, v, out)


def spread_gemv(serial, parallel, x, w, *rest) -> None:  # noqa: ANN001
    """``serial(x, w, *rest)``, or ``parallel`` through jit.run for a matrix large enough."""
    if w.size >= PARALLEL_MIN_WEIGHTS:
        jit.run(serial, parallel, x, w, *rest)
    else:
        serial(x, w, *rest)


# no kernel-layer op of its own: gemv_jit and layer_jit call these
CANDIDATES: dict = {}
