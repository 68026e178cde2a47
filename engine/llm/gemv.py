"""Quantized weight layouts and their numpy kernels (the kernel layer's numpy candidates).

Every matrix is stored as Hugging Face's Linear keeps it, [N outputs, K inputs], so a GEMV is N
contiguous row dot products.

- int8 per-channel: ``q`` int8 [N, K], ``scale`` float32 [N]; w = q * scale (symmetric).
- int4 block-wise (llama.cpp's q4_0 rule): each row is cut into blocks of B (32 or 64) values
  with one float32 scale d = (the block's value of largest magnitude) / -8 and q = round(w / d)
  clipped to [-8, 7], stored as q + 8 in a nibble.  Re-laid for the kernels: byte j of a block
  holds value j in its low nibble and value j + B/2 in its high one, so a kernel reads the
  low nibbles against x[0:B/2] and the high ones against x[B/2:B], both contiguous.
  ``packed`` uint8 [N, K/2], ``scale`` float32 [N, K/B].
- int4 row-grouped (``group`` G = 4 or 8, the layout converters write when G divides N, chosen
  by ``choose_group``): the same
  bytes, re-laid so that G rows' blocks lie side by side per byte index.  Viewed as
  [N/G, B/2, G * K/B], element [i, j, g * K/B + b] is byte j of block b of row G*i + g.  The
  JIT kernel then runs its inner loop across G * K/B lanes (72 for K = 576) with one
  accumulator per (row, block), and needs no horizontal sum per block: the per-block sums that
  made int4 slower than int8 are gone (LM head 49152 x 576: 24 ms -> 2.6 ms, int8 2.9 ms, on a
  loaded host).  ``to_standard`` undoes it for the numpy kernels (a tile at a time).
- int4 dot layout (``group`` = ``DOT_GROUP`` = 16, written for int8 activations where 16
  divides N): four consecutive bytes of a row's block side by side with 15 other rows'.
  Viewed as [N/16, K/B, B/8, 16, 4], element [v, b, c, g, t] is byte 4c + t of block b of row
  16v + g; the scales likewise, [N/16, K/B, 16] (16 rows' scales of a block side by side).
  dot_jit.py's kernels multiply a 4-byte lane of weights by 4 activations in one product
  (vpdpbusd with AVX-512 VNNI).  ``to_standard`` and ``standard_scales`` undo it.

- int8 dot layout (``group`` = ``DOT_GROUP``, ``activations`` "int8", block 32: written where 16
  divides N and 32 divides K): the bytes q + 128 as uint8 (one side of vpdpbusd is unsigned),
  four consecutive bytes of a row side by side with 15 other rows'.  Viewed as [N/16, K/4, 16,
  4], element [v, j, g, t] is q[16v + g, 4j + t] + 128; ``scale`` stays float32 [N] in row
  order.  dot_jit.py's ``gemv_dot8``/``gemm8`` multiply x rounded to int8 per block of 32
  (q8_0 x q8_0's arithmetic); ``int8_from_dot`` undoes it.

- activations (int4; int8 in the dot layout): "float", or "int8": the matrix multiplies x rounded to int8 per
  block of B (llama.cpp's q8_0 rule, d = max |x| / 127, round(x / d)), as q4_0 x q8_0 does.
  Its JIT GEMV then runs in int16 (gemv_jit.py), ~2x the float kernel's speed; the numpy
  kernels and prefill's GEMMs round x the same way first (``quantize_activations``), so
  every path computes the same product and the converter's accuracy report includes it.
  Such matrices keep their block scales as float16 (as q4_0 does): 4.5 bits per weight
  instead of 5, the bytes a memory-bound decode step reads.

The numpy kernels widen ``ROWS_PER_TILE`` rows at a time to float32 (never the whole matrix)
and hand each tile to BLAS.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCKS = (32, 64)
DOT_GROUP = 16  # the dot layout (above): int8 activations only
DOT_SUB = 32  # the dot layouts' step: weights per row summed exactly, activations' offsets per 32
DOT_BLOCK8 = 32  # int8 dot layout: activations rounded per block of 32 (q8_0's), K a multiple
DOT_TOKENS = 8  # prefill on the dot layouts: tokens per weight load (rows padded to a multiple)
GROUPS = (1, 4, 8, DOT_GROUP)
ACTIVATIONS = ("float", "int8")
HALF_MAX = 65504.0  # float16's largest: a larger block scale (|w| > 524032) is clipped
GROUP = 4  # rows per group in the re-laid int4 layout (1: the plain layout), at the least
# The JIT GEMV's inner loop runs across a group's G * K/B lanes, and LLVM's vector body takes 128
# int16 lanes per pass (4 AVX-512 registers): 72 lanes (K = 576, G = 4) never enter it and run
# in the remainder loop.  Hot in L2, 1 thread: K = 576 at G = 4 18.6-19.9 G weights/s, at G = 8
# (144 lanes) 24.3-26.8; K = 1536 at G = 4 (192 lanes) 27.9, at G = 8 26.3; G = 16 slower on
# the LM head (16.8).
LANES_WANTED = 128
# float32 scratch per widened tile.  Prefill's GEMMs (256 x 576 by 3072 x 576, int4, 1 thread)
# measured 23.6 ms with 1 MB tiles, 17.8 with 4 MB, 11.5 with the whole matrix: BLAS wants wide
# tiles; 4 MB bounds the scratch while keeping most of the gain.
TILE_BYTES = 4 << 20


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: (q [N, K] int8, scale [N] float32)."""
    w = np.asarray(w, dtype=np.float32)
    scale = np.abs(w).max(axis=1) / 127.0
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.clip(np.rint(w * inverse[:, None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def int8_dot_layout(n: int, k: int, activations: str) -> bool:
    """Whether an int8 [N, K] matrix is stored in the int8 dot layout (above)."""
    return activations == "int8" and n % DOT_GROUP == 0 and k % BLOCKS[0] == 0


def int8_to_dot(q: np.ndarray) -> np.ndarray:
    """int8 [N, K] (N a multiple of 16, K of 4) -> the int8 dot layout's uint8 bytes [N, K]."""
    n, k = q.shape
    shifted = (np.asarray(q, np.int16) + 128).astype(np.uint8)
    dot = shifted.reshape(n // DOT_GROUP, DOT_GROUP, k // 4, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(dot).reshape(n, k)


def int8_dot_rows(packed: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of an int8 dot-layout matrix as int8 [len(index), K]."""
    n, k = packed.shape
    view = np.asarray(packed).reshape(n // DOT_GROUP, k // 4, DOT_GROUP, 4)
    rows = view[index // DOT_GROUP, :, index % DOT_GROUP, :].reshape(len(index), k)
    return (rows.astype(np.int16) - 128).astype(np.int8)


def int8_from_dot(packed: np.ndarray) -> np.ndarray:
    """``int8_to_dot`` undone: int8 [N, K] in row order."""
    return int8_dot_rows(packed, np.arange(packed.shape[0]))


def choose_group(n: int, k: int, block: int) -> int:
    """Rows per group for an int4 [N, K] matrix: the smallest of 4 and 8 that gives the GEMV at
    least ``LANES_WANTED`` lanes and divides N; 4 (or 1) when neither does."""
    for group in (GROUP, 2 * GROUP):
        if n % group == 0 and group * (k // block) >= LANES_WANTED:
            return group
    return GROUP if n % GROUP == 0 else 1


def dot_layout(n: int, activations: str) -> bool:
    """Whether an int4 [N, K] matrix is stored in the dot layout: its kernels multiply int8
    activations, and whole vectors of 16 rows."""
    return activations == "int8" and n % DOT_GROUP == 0


def quantize_int4(
    w: np.ndarray, block: int, group: int = 1, half_scales: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Block-wise int4 in the re-laid nibble order: (packed [N, K/2] uint8, scale [N, K/B]
    float32, or float16 with ``half_scales``: q4_0's, a tenth fewer bytes per weight); with
    ``group`` > 1 the bytes are row-grouped (``to_grouped``)."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    if block not in BLOCKS or k % block:
        raise ValueError(
            f"int4 needs the input size {k} to be a multiple of the block size {block} (32 or 64)"
        )
    blocks = w.reshape(n, k // block, block)
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)[..., 0]
    scale = (extreme / -8.0).astype(np.float32)
    if half_scales:  # rounded first, so q is chosen against the scale that is stored
        scale = np.clip(scale, -HALF_MAX, HALF_MAX).astype(np.float16).astype(np.float32)
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.clip(np.rint(blocks * inverse[..., None]), -8, 7).astype(np.int16) + 8
    half = block // 2
    packed = (q[..., :half] | (q[..., half:] << 4)).astype(np.uint8)
    scale = scale.astype(np.float16) if half_scales else scale
    return to_grouped(packed.reshape(n, k // 2), block, group), grouped_scales(scale, group)


def to_grouped(packed: np.ndarray, block: int, group: int) -> np.ndarray:
    """Plain [N, K/2] int4 bytes -> the row-grouped or dot layout (same shape; N a multiple of
    group)."""
    if group == 1:
        return packed
    n, half_k = packed.shape
    half, blocks = block // 2, half_k * 2 // block
    if group == DOT_GROUP:
        dot = packed.reshape(n // group, group, blocks, half // 4, 4).transpose(0, 2, 3, 1, 4)
        return np.ascontiguousarray(dot).reshape(n, half_k)
    grouped = packed.reshape(n // group, group, blocks, half).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(grouped).reshape(n, half_k)


def to_standard(packed: np.ndarray, block: int, group: int) -> np.ndarray:
    """Row-grouped int4 bytes (rows a multiple of group) -> the plain layout, [rows, K/2]."""
    if group == 1:
        return packed
    n, half_k = packed.shape
    half, blocks = block // 2, half_k * 2 // block
    if group == DOT_GROUP:
        dot = np.asarray(packed).reshape(n // group, blocks, half // 4, group, 4)
        return dot.transpose(0, 3, 1, 2, 4).reshape(n, half_k)
    plain = np.asarray(packed).reshape(n // group, half, group, blocks).transpose(0, 2, 3, 1)
    return plain.reshape(n, half_k)


def regroup(packed: np.ndarray, scale: np.ndarray, block: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``group`` layout's bytes and scales [N, K/2], [N, K/B] -> the dot layout's."""
    plain, scales = to_standard(packed, block, group), standard_scales(scale, group)
    return to_grouped(np.ascontiguousarray(plain), block, DOT_GROUP), grouped_scales(scales, DOT_GROUP)


def grouped_scales(scale: np.ndarray, group: int) -> np.ndarray:
    """Block scales [N, K/B] in the order ``group``'s layout stores them (only the dot layout
    reorders them: 16 rows' scales of a block side by side)."""
    if group != DOT_GROUP:
        return scale
    n, blocks = scale.shape
    dot = scale.reshape(n // group, group, blocks).transpose(0, 2, 1)
    return np.ascontiguousarray(dot).reshape(n, blocks)


def standard_scales(scale: np.ndarray, group: int) -> np.ndarray:
    """``grouped_scales`` undone: [rows, K/B] in row order (rows a multiple of group)."""
    if group != DOT_GROUP:
        return scale
    n, blocks = scale.shape
    return np.asarray(scale).reshape(n // group, blocks, group).transpose(0, 2, 1).reshape(n, blocks)


def grouped_rows(packed: np.ndarray, index: np.ndarray, block: int, group: int) -> np.ndarray:
    """Plain-layout bytes of the rows ``index`` of a row-grouped int4 matrix, [len(index), K/2]."""
    if group == 1:
        return np.asarray(packed)[index]
    n, half_k = packed.shape
    half, blocks = block // 2, half_k * 2 // block
    if group == DOT_GROUP:
        dot = np.asarray(packed).reshape(n // group, blocks, half // 4, group, 4)
        return dot[index // group, :, :, index % group, :].reshape(len(index), half_k)
    view = np.asarray(packed).reshape(n // group, half, group, blocks)
    return view[index // group, :, index % group, :].transpose(0, 2, 1).reshape(len(index), half_k)


def grouped_scale_rows(scale: np.ndarray, index: np.ndarray, group: int) -> np.ndarray:
    """The block scales of the rows ``index`` (in the layout's order), [len(index), K/B]."""
    if group != DOT_GROUP:
        return np.asarray(scale)[index]
    n, blocks = scale.shape
    return np.asarray(scale).reshape(n // group, blocks, group)[index // group, :, index % group]


def quantize_activations(x: np.ndarray, block: int) -> np.ndarray:
    """x [M, K] float32 as the int8-activation kernels see it: per block of ``block`` values,
    d = max |x| / 127 and x -> round(x * 127 / max |x|) * d (gemv_jit's ``_quantize_x``)."""
    m, k = x.shape
    blocks = np.asarray(x, np.float32).reshape(m, k // block, block)
    largest = np.abs(blocks).max(axis=2, keepdims=True)
    inverse = np.divide(np.float32(127.0), largest, out=np.zeros_like(largest), where=largest > 0)
    rounded = np.rint(blocks * inverse) * (largest / np.float32(127.0))
    return rounded.reshape(m, k).astype(np.float32, copy=False)


def dequantize_int4(packed: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    """Rows of an int4 matrix as float32 [rows, K]."""
    rows, blocks = scale.shape
    half = block // 2
    p = np.asarray(packed).reshape(rows, blocks, half)
    values = np.empty((rows, blocks, block), np.float32)
    np.bitwise_and(p, 15, out=values[..., :half], casting="unsafe")
    np.right_shift(p, 4, out=values[..., half:], casting="unsafe")
    values -= 8.0
    values *= scale[..., None]
    return values.reshape(rows, blocks * block)


def tile_rows(k: int, multiple: int = 1) -> int:
    return max(1, TILE_BYTES // (4 * k) // multiple) * multiple


def gemm_int8(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x [M, K] float32 times the int8 matrix's transpose -> [M, N], widening a tile at a time."""
    n, k = q.shape
    out = np.empty((x.shape[0], n), np.float32)
    step = tile_rows(k)
    for start in range(0, n, step):
        tile = q[start : start + step].astype(np.float32)
        np.matmul(x, tile.T, out=out[:, start : start + step])
    out *= scale
    return out


def gemm_int8_dot(x: np.ndarray, packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``gemm_int8`` for the int8 dot layout: x rounded to int8 per block of 32 first, as the JIT
    kernels round it (so the numpy path and the accuracy report see the same product)."""
    n, k = packed.shape
    x = quantize_activations(x, BLOCKS[0])
    out = np.empty((x.shape[0], n), np.float32)
    step = tile_rows(k, DOT_GROUP)
    for start in range(0, n, step):
        tile = int8_from_dot(packed[start : start + step]).astype(np.float32)
        np.matmul(x, tile.T, out=out[:, start : start + step])
    out *= scale
    return out


def gemm_int4(
    x: np.ndarray,
    packed: np.ndarray,
    scale: np.ndarray,
    block: int,
    group: int = 1,
    activations: str = "float",
) -> np.ndarray:
    """x [M, K] float32 times the int4 matrix's transpose -> [M, N], a dequantized tile at a time
    (x rounded to int8 per block first when ``activations`` is "int8")."""
    if activations == "int8":
        x = quantize_activations(x, block)
    n = scale.shape[0]
    k = scale.shape[1] * block
    out = np.empty((x.shape[0], n), np.float32)
    step = tile_rows(k, group)
    for start in range(0, n, step):
        plain = to_standard(packed[start : start + step], block, group)
        tile = dequantize_int4(plain, standard_scales(scale[start : start + step], group), block)
        np.matmul(x, tile.T, out=out[:, start : start + step])
    return out


def gemm_float(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [M, K] float32 times a float32 or float16 matrix's transpose; float16 a tile at a time."""
    if w.dtype == np.float32:
        return x @ w.T
    n, k = w.shape
    out = np.empty((x.shape[0], n), np.float32)
    step = tile_rows(k)
    for start in range(0, n, step):
        np.matmul(x, w[start : start + step].astype(np.float32).T, out=out[:, start : start + step])
    return out


# The kernel layer's numpy candidates: Kernel(inputs, attrs) -> [output], one row x [K].
def gemv_int8_numpy(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: x [K] float32, q [N, K] int8 (or uint8: the int8 dot layout), scale [N] float32
    -> [N]."""
    x, q, scale = inputs
    if q.dtype == np.uint8:
        return [gemm_int8_dot(x[None, :], q, scale)[0]]
    return [gemm_int8(x[None, :], q, scale)[0]]


def gemv_int4_numpy(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """inputs: x [K] float32, packed [N, K/2] uint8, scale [N, K/B] float32; attrs: block, group
    (1 when absent), activations ("float" when absent) -> [N]."""
    x, packed, scale = inputs
    block, group = int(attrs["block"]), int(attrs.get("group", 1))
    activations = attrs.get("activations", "float")
    return [gemm_int4(x[None, :], packed, scale, block, group, activations)[0]]


def _decode_attention(inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    from engine.llm.attention import decode_attention_numpy  # noqa: PLC0415

    return decode_attention_numpy(inputs, attrs)


# The LLM runtime's numpy kernels by op (engine/kernels.py); decode attention rides along.
NUMPY_GEMV = {
    "LlmGemvInt8": gemv_int8_numpy,
    "LlmGemvInt4": gemv_int4_numpy,
    "LlmDecodeAttention": _decode_attention,
}
