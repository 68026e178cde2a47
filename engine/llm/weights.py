"""The model's matrices at their stored precision, each with a GEMV (decode) and a GEMM (prefill).

``Matrix`` holds [N, K] weights as float32, float16, int8 per-channel or int4 block-wise
(layouts in gemv.py).  Decode's int8/int4 GEMVs go through the engine's kernel layer
(engine/kernels.py): the JIT kernel when numba is on, else the numpy one; without numba the
runtime says so once.  Prefill multiplies by BLAS on tiles widened to float32 (int4 tiles
dequantized by a JIT kernel when numba is on).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import jit, kernels
from engine.llm import aot, gemv

PRECISIONS = ("fp32", "fp16", "int8", "int4")
_log = logging.getLogger(__name__)
_warned: list[bool] = []
_kernels: dict[str, Any] = {}


def gemv_kernel(op: str) -> Any:
    """The kernel this process runs for ``op`` (LlmGemvInt4/LlmGemvInt8/LlmDecodeAttention): JIT if
    there, else numpy."""
    compiled = aot.kernels() if op in ("LlmGemvInt4", "LlmGemvInt8") else None
    if compiled is not None:  # ahead of time: numba stays out of this process (aot.py)
        return compiled.gemv_int4 if op == "LlmGemvInt4" else compiled.gemv_int8
    found = _kernels.get(op)
    if found is None:
        jit.load(ops=[op])
        found = _kernels[op] = kernels.candidates(op, {}, [])[-1]
        if kernels.tier(found) == "numpy" and not _warned:
            _warned.append(True)
            _log.warning("LLM decode runs numpy GEMV kernels (numba missing or FERRY_JIT=0): slower")
    return found


@dataclass
class Matrix:
    """[N, K] weights; ``arrays`` holds the stored arrays ("w", or "q"+"scale")."""

    kind: str  # one of PRECISIONS
    shape: tuple[int, int]
    arrays: dict[str, np.ndarray]
    block: int = 0
    group: int = 1  # rows per group of the re-laid layout (gemv.py; int8: 16, the dot layout)
    activations: str = "float"  # "int8" multiplies x rounded per block (gemv.py)
    _op: Any = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def check(self, name: str, shape: tuple[int, int]) -> None:
        """Refuse stored arrays that do not make the [N, K] matrix ``shape`` at this kind: the JIT
        kernels index without bounds checks, so a malformed package must stop here."""
        n, k = shape
        wanted: dict[str, tuple[tuple[int, ...], str]] = {}
        if self.kind in ("fp32", "fp16"):
            wanted = {"w": ((n, k), "<f4" if self.kind == "fp32" else "<f2")}
        elif self.kind == "int8" and (self.group, self.activations) == (1, "float"):
            wanted = {"q": ((n, k), "|i1"), "scale": ((n,), "<f4")}
        elif (
            self.kind == "int8"
            and (self.block, self.group, self.activations) == (gemv.BLOCKS[0], gemv.DOT_GROUP, "int8")
            and gemv.int8_dot_layout(n, k, self.activations)
        ):  # the int8 dot layout (gemv.py): q + 128 as uint8
            wanted = {"q": ((n, k), "|u1"), "scale": ((n,), "<f4")}
        elif (
            self.kind == "int4"
            and self.block in gemv.BLOCKS
            and k % self.block == 0
            and self.group in gemv.GROUPS
            and n % self.group == 0
            and self.activations in gemv.ACTIVATIONS
            and (self.group != gemv.DOT_GROUP or self.activations == "int8")
        ):
            half = self.activations == "int8"  # float16 scales beside int8 activations (gemv.py)
            wanted = {"q": ((n, k // 2), "|u1"), "scale": ((n, k // self.block), "<f2" if half else "<f4")}
        if self.activations != "float" and self.kind not in ("int4", "int8"):
            raise ValueError(f"matrix {name}: activations {self.activations!r} apply to int4 and int8 only")
        if not wanted:
            raise ValueError(
                f"matrix {name}: kind {self.kind!r} with block {self.block}, group {self.group}, "
                f"activations {self.activations!r} cannot hold {list(shape)}"
            )
        if tuple(self.shape) != shape or set(self.arrays) != set(wanted):
            raise ValueError(
                f"matrix {name}: holds {sorted(self.arrays)} as {list(self.shape)}, wants {list(shape)}"
            )
        for part, (part_shape, dtype) in wanted.items():
            array = self.arrays[part]
            if array.shape != part_shape or array.dtype.str != dtype:
                found = f"{array.dtype.str}{list(array.shape)}"
                raise ValueError(f"matrix {name}.{part}: {found}, wants {dtype}{list(part_shape)}")

    def gemv(self, x: np.ndarray) -> np.ndarray:
        """W @ x for one float32 row x [K] -> [N]."""
        if self.kind in ("fp32", "fp16"):
            w = self.arrays["w"]
            return w @ x if w.dtype == np.float32 else gemv.gemm_float(x[None, :], w)[0]
        if self._op is None:
            self._op = gemv_kernel("LlmGemvInt4" if self.kind == "int4" else "LlmGemvInt8")
        attrs = {"block": self.block, "group": self.group, "activations": self.activations}
        return self._op([x, self.arrays["q"], self.arrays["scale"]], attrs)[0]

    def gemm(self, x: np.ndarray) -> np.ndarray:
        """x [M, K] @ W.T -> [M, N] (prefill), BLAS on float32 tiles."""
        if self.kind in ("fp32", "fp16"):
            return gemv.gemm_float(x, self.arrays["w"])
        if self.kind == "int8" and self.group == gemv.DOT_GROUP:
            if jit.enabled():  # 4-byte integer dot products (dot_jit.py), the same rounded x
                return _dot_kernels().gemm8(x, self.arrays["q"], self.arrays["scale"])
            return gemv.gemm_int8_dot(x, self.arrays["q"], self.arrays["scale"])
        if self.kind == "int8":
            return gemv.gemm_int8(x, self.arrays["q"], self.arrays["scale"])
        q, scale = self.arrays["q"], self.arrays["scale"]
        if jit.enabled() and self.group == gemv.DOT_GROUP:  # dot_jit.py's GEMM (or aot.py's)
            return _dot_kernels().gemm(x, q, scale, self.block)
        if jit.enabled():  # tiles dequantized by a JIT kernel (gemv_jit.py), the same products
            kernels = jit.module("engine.llm.gemv_jit")
            return kernels.gemm_int4_jit(x, q, scale, self.block, self.group, self.activations)
        return gemv.gemm_int4(x, q, scale, self.block, self.group, self.activations)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Rows of W as float32 [len(index), K] (an embedding lookup)."""
        index = np.asarray(index, dtype=np.int64)
        if self.kind in ("fp32", "fp16"):
            return self.arrays["w"][index].astype(np.float32)
        if self.kind == "int8":
            q = self.arrays["q"]
            rows = gemv.int8_dot_rows(q, index) if self.group == gemv.DOT_GROUP else q[index]
            return rows.astype(np.float32) * self.arrays["scale"][index][:, None]
        scale = gemv.grouped_scale_rows(self.arrays["scale"], index, self.group)
        q = gemv.grouped_rows(self.arrays["q"], index, self.block, self.group)
        return gemv.dequantize_int4(q, scale, self.block)

    def dense(self) -> np.ndarray:
        """The whole matrix as float32 (tests and accuracy reports only)."""
        return self.rows(np.arange(self.shape[0]))


def make_matrix(
    w: np.ndarray, kind: str, block: int = 32, group: int | None = None, activations: str = "float"
) -> Matrix:
    """Store float weights [N, K] at ``kind``; int4 falls back to int8 for a K the block does not
    divide, and is stored in the dot layout (int8 activations, 16 rows dividing N) or else
    row-grouped (``gemv.choose_group``) when it can be unless ``group`` says; ``activations``
    (gemv.py) says how it multiplies x: int8 with "int8" is stored in the int8 dot layout where
    16 divides N and 32 divides K."""
    w = np.asarray(w)
    shape = (int(w.shape[0]), int(w.shape[1]))
    if kind == "fp32":
        return Matrix("fp32", shape, {"w": np.ascontiguousarray(w, np.float32)})
    if kind == "fp16":
        return Matrix("fp16", shape, {"w": np.ascontiguousarray(w, np.float16)})
    if kind == "int4" and shape[1] % block == 0:
        if group is None and gemv.dot_layout(shape[0], activations):
            group = gemv.DOT_GROUP
        elif group is None:
            group = gemv.choose_group(shape[0], shape[1], block)
        q, scale = gemv.quantize_int4(w, block, group, half_scales=activations == "int8")
        arrays = {"q": q, "scale": scale}
        return Matrix("int4", shape, arrays, block=block, group=group, activations=activations)
    if kind in ("int4", "int8"):
        q, scale = gemv.quantize_int8(w)
        if gemv.int8_dot_layout(shape[0], shape[1], activations):  # x rounded per block of 32
            q = gemv.int8_to_dot(q)
            block, group = gemv.BLOCKS[0], gemv.DOT_GROUP
            return Matrix("int8", shape, {"q": q, "scale": scale}, block, group, activations)
        return Matrix("int8", shape, {"q": q, "scale": scale})
    raise ValueError(f"weights precision {kind!r} is not one of {', '.join(PRECISIONS)}")


def _dot_kernels() -> Any:
    """dot_jit's prefill GEMMs: the ahead-of-time extension's when built (aot.py), else numba's."""
    return aot.kernels() or jit.module("engine.llm.dot_jit")
