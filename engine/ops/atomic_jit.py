"""Atomic int64 counters, a spin-wait hint and arrays from raw addresses, for numba kernels
that several threads run at once and that coordinate through shared counters rather than a
pool's barrier (engine/llm/spread_jit.py's decode token, engine/ops/team_jit.py's spinning
worker).  LLVM's own atomics: numba has none."""

from __future__ import annotations

import platform
import sys

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

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
def atomic_cas(typingctx, array, index, expected, value):  # noqa: ANN001, ANN201, ARG001
    """array[index] = value if it holds ``expected`` (atomically); whether it did."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        pair = builder.cmpxchg(
            _slot(context, builder, signature, args), args[2], args[3], "seq_cst", "seq_cst"
        )
        return builder.extract_value(pair, 1)

    return types.boolean(array, types.intp, types.int64, types.int64), codegen


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


@intrinsic
def yield_core(typingctx):  # noqa: ANN001, ANN201, ARG001
    """sched_yield(): a spinning thread lets a runnable one (an OpenBLAS worker) have its core."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield"
        )
        builder.call(function, [])
        return context.get_dummy_value()

    return types.void(), codegen


_LINUX = sys.platform.startswith("linux")
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # FUTEX_WAIT / FUTEX_WAKE, FUTEX_PRIVATE_FLAG
FUTEX = _LINUX and _SYS_FUTEX is not None


def _futex(builder, pointer, operation: int, value) -> None:  # noqa: ANN001
    """syscall(SYS_futex, pointer, operation, value, NULL): on the low 32 bits of an int64 slot
    (little-endian: its first four bytes)."""
    i64 = ir.IntType(64)
    syscall = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall"
    )
    address = builder.bitcast(pointer, ir.IntType(32).as_pointer())
    null = ir.Constant(ir.IntType(8).as_pointer(), None)
    # varargs: every integer as 64 bits, so no register's upper half is left undefined
    number, operation_ = ir.Constant(i64, _SYS_FUTEX), ir.Constant(i64, operation)
    arguments = [number, address, operation_, builder.zext(value, i64), null]
    builder.call(syscall, arguments)


@intrinsic
def wait_while(typingctx, array, index, value):  # noqa: ANN001, ANN201, ARG001
    """Sleep, without the GIL, while array[index] (int64, below 2^31) holds ``value``: a futex
    wait on Linux (woken by ``wake``), elsewhere a 200 us nap; it may return early, so callers
    look again."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        i32 = ir.IntType(32)
        if FUTEX:
            _futex(
                builder, _slot(context, builder, signature, args), _FUTEX_WAIT, builder.trunc(args[2], i32)
            )
        else:
            usleep = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32]), "usleep")
            builder.call(usleep, [ir.Constant(i32, 200)])
        return context.get_dummy_value()

    return types.void(array, types.intp, types.int64), codegen


@intrinsic
def wake(typingctx, array, index):  # noqa: ANN001, ANN201, ARG001
    """Wake the threads ``wait_while`` put to sleep on array[index] (a no-op where they nap)."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if FUTEX:
            _futex(
                builder,
                _slot(context, builder, signature, args),
                _FUTEX_WAKE,
                ir.Constant(ir.IntType(32), 1 << 30),
            )
        return context.get_dummy_value()

    return types.void(array, types.intp), codegen


@intrinsic
def pointer(typingctx, address, like):  # noqa: ANN001, ANN201, ARG001
    """``address`` (an int64) as a pointer to ``like``'s dtype (an array, or a
    numpy scalar type)."""
    dtype = like.dtype if isinstance(like, types.Array) else like.instance_type
    target = types.CPointer(dtype)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.inttoptr(args[0], context.get_value_type(target))

    return target(types.int64, like), codegen


@numba.njit(inline="always", cache=True)
def put_array(table, i, array):  # noqa: ANN001, ANN202
    """Row ``i`` of ``table`` = (address, length) of ``array``: what ``array_at`` reads back."""
    table[i, 0], table[i, 1] = array.ctypes.data, array.size


@numba.njit(inline="always", cache=True)
def array_at(table, i, like):  # noqa: ANN001, ANN202
    """Array ``i`` of ``table`` (rows of address, length) as ``like``'s dtype: the arrays
    the table lists, which its caller keeps alive."""
    return numba.carray(pointer(table[i, 0], like), table[i, 1])
