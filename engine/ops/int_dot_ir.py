"""LLVM IR pieces the integer dot-product kernels share (int8_gemm_jit.py, engine/llm/dot_jit.py):
numba has no vector types, so their inner steps are written as IR inside numba intrinsics.

``dot`` is one vpdpbusd with AVX-512 VNNI; with AVX2 (no VNNI: AMD Zen 2/3, Intel before Ice
Lake) it splits each 32-bit lane's four bytes into its even and odd bytes as 16-bit words and
multiplies them with vpmaddwd, whose pairs of products are the lane's (see ``_dot_avx2``);
elsewhere generic IR that LLVM lowers for the target.  Importing this compiles nothing;
``VNNI`` and ``AVX2`` are read once (the JIT tier is loaded by then).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils

from engine import jit

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
SUMS, BYTES = ir.VectorType(I32, 16), ir.VectorType(I8, 64)
_HALF, _WORDS = ir.VectorType(I32, 8), ir.VectorType(I16, 16)
_BYTES = ir.VectorType(I8, 32)  # one 256-bit half of 64 bytes


def has_avx2() -> bool:
    """Whether numba compiles for a CPU with AVX2 (its host, unless NUMBA_CPU_NAME or
    NUMBA_CPU_FEATURES say otherwise), as ``jit.has_vnni`` decides for VNNI."""
    import llvmlite.binding as llvm  # noqa: PLC0415 - only with the JIT tier
    from numba.core import config  # noqa: PLC0415

    if config.CPU_FEATURES is not None:
        return "+avx2" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME not in (None, "host"):
        return False  # a named CPU: the generic IR is right for any of them
    return bool(llvm.get_host_cpu_features().get("avx2", False))


VNNI = jit.has_vnni()
AVX2 = has_avx2()
PATH = "vnni" if VNNI else "avx2" if AVX2 else "generic"  # which ``dot`` the kernels compile


def splat(builder: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    """``value`` in every lane of ``vector``."""
    undefined = ir.Constant(vector, ir.Undefined)
    first = builder.insert_element(undefined, value, ir.Constant(I32, 0))
    return builder.shuffle_vector(first, undefined, ir.Constant(ir.VectorType(I32, vector.count), None))


def dot(builder: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    """acc[lane] (16 int32) += the 4 products of the lane's unsigned and signed bytes, exactly:
    one vpdpbusd with AVX-512 VNNI, vpmaddwd with AVX2, elsewhere generic IR (widen, multiply,
    add) LLVM lowers for the target."""
    if VNNI:
        return _dot_vnni(builder, acc, unsigned, signed)
    if AVX2:
        return _dot_avx2(builder, acc, unsigned, signed)
    return _dot_generic(builder, acc, unsigned, signed)


def _dot_vnni(builder: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    function = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(SUMS, [SUMS] * 3), "llvm.x86.avx512.vpdpbusd.512"
    )
    return builder.call(function, [acc, unsigned, signed])


def _dot_generic(builder: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    wide = ir.VectorType(I32, 64)
    products = builder.mul(
        builder.zext(builder.bitcast(unsigned, BYTES), wide),
        builder.sext(builder.bitcast(signed, BYTES), wide),
    )
    undefined = ir.Constant(wide, ir.Undefined)
    lanes = [ir.Constant(SUMS, list(range(i, 64, 4))) for i in range(4)]
    parts = [builder.shuffle_vector(products, undefined, lane) for lane in lanes]
    return builder.add(acc, builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3])))


def _dot_avx2(builder: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    return dot_words(builder, acc, *unsigned_words(builder, unsigned), *signed_words(builder, signed))


# AVX2: a lane's bytes b0..b3 are the 16-bit words (b0 | b1 << 8, b2 | b3 << 8); masking or
# shifting each word gives its even bytes (b0, b2) and its odd bytes (b1, b3) as 16-bit integers
# in place, and vpmaddwd of even x even plus odd x odd sums the lane's four products into its
# own 32-bit lane: exact (|products| <= 255 * 128), no shuffle across lanes.  Shaping a vector
# costs 2-3 instructions; LLVM does it once however many dot products share the vector, and a
# kernel whose weights are fixed stores them shaped (``words``).


def unsigned_words(builder: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """16 lanes of 4 unsigned bytes -> (even bytes, odd bytes), each lane two uint16 words."""
    words = ir.VectorType(I16, 32)
    x = builder.bitcast(x, words)
    even = builder.and_(x, ir.Constant(words, [0xFF] * 32))
    odd = builder.lshr(x, ir.Constant(words, [8] * 32))
    return builder.bitcast(even, SUMS), builder.bitcast(odd, SUMS)


def signed_words(builder: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """16 lanes of 4 signed bytes -> (even bytes, odd bytes), each lane two int16 words."""
    words = ir.VectorType(I16, 32)
    x, eight = builder.bitcast(x, words), ir.Constant(words, [8] * 32)
    even = builder.ashr(builder.shl(x, eight), eight)
    return builder.bitcast(even, SUMS), builder.bitcast(builder.ashr(x, eight), SUMS)


def dot_words(
    builder: ir.IRBuilder, acc: ir.Value, u_even: ir.Value, u_odd: ir.Value, s_even: ir.Value, s_odd: ir.Value
) -> ir.Value:
    """``dot`` on operands already split into words (``unsigned_words``, ``signed_words`` or
    ``words``): two vpmaddwd per 256-bit half (AVX2)."""
    madd = _intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _HALF, _WORDS)
    halves = []
    for half in range(2):

        def take(x: ir.Value, half: int = half) -> ir.Value:
            return _half(builder, x, half, _WORDS)

        even = builder.call(madd, [take(u_even), take(s_even)])
        halves.append(builder.add(even, builder.call(madd, [take(u_odd), take(s_odd)])))
    return _joined(builder, acc, halves)


def _intrinsic(builder: ir.IRBuilder, name: str, result: ir.Type, operand: ir.Type) -> ir.Function:
    """The LLVM intrinsic ``name`` taking two ``operand`` vectors, declared once per module."""
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, [operand, operand]), name)


def _half(builder: ir.IRBuilder, x: ir.Value, half: int, vector: ir.VectorType) -> ir.Value:
    """Lanes 8 half .. 8 half + 7 of 16 (one 256-bit half) as ``vector``."""
    lanes = ir.Constant(_HALF, list(range(8 * half, 8 * half + 8)))
    return builder.bitcast(builder.shuffle_vector(x, ir.Constant(SUMS, ir.Undefined), lanes), vector)


def _joined(builder: ir.IRBuilder, acc: ir.Value, halves: list[ir.Value]) -> ir.Value:
    """acc + the two 8-lane halves put back together as 16 lanes."""
    return builder.add(acc, builder.shuffle_vector(halves[0], halves[1], ir.Constant(SUMS, list(range(16)))))


SMALL_PAIRS = 8  # dot_small's most pairs: 8 * 2 * 15 * 128 = 30720 fits a 16-bit sum


def dot_small(builder: ir.IRBuilder, acc: ir.Value, pairs: list[tuple[ir.Value, ir.Value]]) -> ir.Value:
    """acc += the sum of ``dot(acc, u, s)`` over up to SMALL_PAIRS (u, s), every unsigned byte
    at most 15 (int4 nibbles).  With AVX2 (no VNNI): vpmaddubsw per pair (the two products of
    a word pair are at most 2 * 15 * 128, no saturation), the pairs summed in 16 bits (exact,
    see SMALL_PAIRS), one vpmaddwd by ones into the lanes: 3 instructions per pair and half
    instead of 8; elsewhere one ``dot`` per pair."""
    if VNNI or not AVX2:
        for u, s in pairs:
            acc = dot(builder, acc, u, s)
        return acc
    assert len(pairs) <= SMALL_PAIRS
    maddubs = _intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _WORDS, _BYTES)
    madd = _intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _HALF, _WORDS)
    halves = []
    for half in range(2):
        total = None
        for u, s in pairs:
            words = builder.call(maddubs, [_half(builder, u, half, _BYTES), _half(builder, s, half, _BYTES)])
            total = words if total is None else builder.add(total, words)
        halves.append(builder.call(madd, [total, ir.Constant(_WORDS, [1] * 16)]))
    return _joined(builder, acc, halves)


def dot_signed(builder: ir.IRBuilder, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """acc[lane] += the 4 products of the lane's signed bytes a (any) and b (in [-127, 127]),
    with AVX2 only: vpmaddubsw(|a| as unsigned bytes, b with a's signs) (llama.cpp's q8_0 trick;
    |-128| is the unsigned byte 128, and two products of at most 128 * 127 do not saturate),
    then vpmaddwd by ones into the lanes.  |a| is shared by every b it meets."""
    assert AVX2, "dot_signed is the AVX2 path's"
    sign = _intrinsic(builder, "llvm.x86.avx2.psign.b", _BYTES, _BYTES)
    maddubs = _intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _WORDS, _BYTES)
    madd = _intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _HALF, _WORDS)
    halves = []
    for half in range(2):
        a_half, b_half = _half(builder, a, half, _BYTES), _half(builder, b, half, _BYTES)
        magnitude = builder.call(sign, [a_half, a_half])
        words = builder.call(maddubs, [magnitude, builder.call(sign, [b_half, a_half])])
        halves.append(builder.call(madd, [words, ir.Constant(_WORDS, [1] * 16)]))
    return _joined(builder, acc, halves)


def words(x: np.ndarray) -> np.ndarray:
    """int8 [..., 16 lanes, 4] -> int16 [..., 2, 16 lanes, 2]: each 64-byte vector as its even
    words then its odd words, as ``signed_words`` makes them (a fixed operand shaped once)."""
    lanes = x.reshape(*x.shape[:-2], 16, 2, 2).astype(np.int16)  # [..., lane, pair, byte in pair]
    return np.ascontiguousarray(np.moveaxis(lanes, -1, -3))


def pointer(context, builder, array_type, array, offset, element):  # noqa: ANN001, ANN201
    """Pointer to ``element`` (an LLVM type) at element ``offset`` of a flat numba array."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), element.as_pointer())
