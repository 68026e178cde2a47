"""LLVM IR pieces the integer dot-product kernels share (int8_gemm_jit.py, engine/llm/dot_jit.py):
numba has no vector types, so their inner steps are written as IR inside numba intrinsics.

Importing this compiles nothing; ``VNNI`` is read once (the JIT tier is loaded by then).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from engine import jit

VNNI = jit.has_vnni()
I8, I32 = ir.IntType(8), ir.IntType(32)
SUMS, BYTES = ir.VectorType(I32, 16), ir.VectorType(I8, 64)


def splat(builder: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    """``value`` in every lane of ``vector``."""
    undefined = ir.Constant(vector, ir.Undefined)
    first = builder.insert_element(undefined, value, ir.Constant(I32, 0))
    return builder.shuffle_vector(first, undefined, ir.Constant(ir.VectorType(I32, vector.count), None))


def dot(builder: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    """acc[lane] (16 int32) += the 4 products of the lane's unsigned and signed bytes: one
    vpdpbusd with AVX-512 VNNI, elsewhere generic IR (widen, multiply, add) LLVM lowers for the
    target."""
    if VNNI:
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(SUMS, [SUMS] * 3), "llvm.x86.avx512.vpdpbusd.512"
        )
        return builder.call(function, [acc, unsigned, signed])
    wide = ir.VectorType(I32, 64)
    products = builder.mul(
        builder.zext(builder.bitcast(unsigned, BYTES), wide),
        builder.sext(builder.bitcast(signed, BYTES), wide),
    )
    undefined = ir.Constant(wide, ir.Undefined)
    lanes = [ir.Constant(SUMS, list(range(i, 64, 4))) for i in range(4)]
    parts = [builder.shuffle_vector(products, undefined, lane) for lane in lanes]
    return builder.add(acc, builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3])))


def pointer(context, builder, array_type, array, offset, element):  # noqa: ANN001, ANN201
    """Pointer to ``element`` (an LLVM type) at element ``offset`` of a flat numba array."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), element.as_pointer())
