"""Fused ops the converter emits: Conv / Gemm / MatMul (+ bias) followed by an activation, and
scaled dot-product attention.

The attrs are the base op's, plus ``activation`` (Relu, Clip, Sigmoid, HardSwish, Gelu,
LeakyRelu...) and ``activation_attrs`` (that op's attributes; Clip's bounds as ``min``/``max``).
The activation is applied in place on the base op's freshly computed output, which saves a
pass over memory and an intermediate array.

FusedConv may take a fourth input, a residual of exactly the output's shape (the bias input
may then be empty): the result is activation(conv(X, W, B) + residual), a skip connection's
Add (and the activation after it) done by the conv kernel.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ops import fastmath
from engine.ops.conv import fused_bounds
from engine.ops.fastmath import gelu_into
from engine.ops.inplace import clip_into
from engine.ops.normalization import ones_vector
from engine.ops.registry import CHECKS, REGISTRY, SELECTORS, Kernel, check, prepare, register, selector

INTERNAL_OPS = frozenset({"FusedConv", "FusedGemm", "FusedMatMul", "FusedAttention"})
ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSwish", "Gelu", "LeakyRelu", "Tanh", "HardSigmoid")


def apply_activation(y: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The node's activation applied to ``y`` (a fresh array this node owns)."""
    name = attrs.get("activation")
    if name is None:
        return y
    bounds = fused_bounds(attrs)
    if bounds is not None:  # Relu, Clip: one np.clip pass
        return clip_into(y, *bounds, y)
    extra = attrs.get("activation_attrs") or {}
    if name == "Gelu" and extra.get("approximate", "none") == "none" and y.dtype == np.float32:
        return gelu_into(y, y)
    return REGISTRY[name]([y], extra)[0]


def _check_fused(base: str) -> Any:
    def check_node(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> str | None:
        name = attrs.get("activation")
        if name is not None and name not in ACTIVATIONS:
            return f"fused activation {name!r} is not one of {ACTIVATIONS}"
        if name is not None and name in CHECKS:
            reason = CHECKS[name](attrs.get("activation_attrs") or {}, 1, 1)
            if reason:
                return reason
        if base == "Conv" and n_inputs > 4:
            return f"FusedConv takes X, W, B and a residual, not {n_inputs} inputs"
        return CHECKS[base](attrs, n_inputs, n_outputs) if base in CHECKS else None

    return check_node


for _base in ("Conv", "Gemm", "MatMul"):
    check(f"Fused{_base}")(_check_fused(_base))


@register("FusedConv")
def fused_conv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    shapes = [None if v is None else v.shape for v in inputs]
    return select_fused_conv(attrs, shapes)(inputs, attrs)


@selector("FusedConv")
def select_fused_conv(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> Kernel:
    """The Conv variant the engine would pick for these shapes, with the activation after it
    (unless the kernel applies a Relu / Clip itself: ``fuses_clip``).  Every Conv kernel adds
    the residual (input 3) itself, before its clip."""
    return with_activation(SELECTORS["Conv"](attrs, shapes) if "Conv" in SELECTORS else REGISTRY["Conv"])


@functools.cache
def with_activation(inner: Kernel) -> Kernel:
    """The Conv kernel ``inner`` as a FusedConv kernel: the activation after it, unless it applied
    the Relu / Clip in its own last pass (``fuses_clip``).  One wrapper per kernel (the selector
    and the search hand out the same one), named after it and packing its weights as it does."""
    fuses_clip = getattr(inner, "fuses_clip", False)

    def fused_variant(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
        y = inner(inputs, attrs)[0]
        if fuses_clip and fused_bounds(attrs) is not None:
            return [y]
        return [apply_activation(y, attrs)]

    fused_variant.__name__ = f"fused_{inner.__name__}"
    fused_variant.__module__ = inner.__module__
    if hasattr(inner, "pack"):
        fused_variant.pack = inner.pack  # type: ignore[attr-defined]
    return fused_variant


@register("FusedGemm")
def fused_gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [apply_activation(REGISTRY["Gemm"](inputs, attrs)[0], attrs)]


# numpy adds a row-vector bias one output row per inner-loop call; a bias tiled over this many
# rows (packed once per plan) makes the calls 16x longer: ~30% off the add for a (197, 768) output.
BIAS_ROWS = 16
TILED_BIAS_MIN_ELEMENTS = 1 << 16


@register("FusedMatMul")
def fused_matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A @ B, plus a bias (input 2, broadcast over the last axis; or, packed, tiled BIAS_ROWS
    times) when given, then the activation."""
    a, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if a.size == a.shape[-1] > 0 and w.ndim == 2 and _row_bias(bias, w.shape[1]):
        return [_one_row_matmul(a, w, bias, attrs)]
    y = np.matmul(a, w)
    if bias is not None:
        _add_bias(y, bias)
    return [apply_activation(y, attrs)]


def _row_bias(bias: np.ndarray | None, n: int) -> bool:
    """Whether the bias is a vector the one-row path can add: [n] or its tiled [BIAS_ROWS * n]."""
    return bias is None or (bias.ndim == 1 and bias.shape[0] in (n, BIAS_ROWS * n))


def _one_row_matmul(
    a: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    attrs: dict[str, Any],
    product: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.dot,
) -> np.ndarray:
    """One input row (a decode step): a 1-D ``product`` (BLAS gemv by default, ~1 us less than
    matmul) with the bias and activation on the 1-D result (broadcasting over size-1 leading
    dims costs twice as much)."""
    y = product(a.reshape(-1), w)
    if bias is not None:
        y += bias[: y.shape[0]]
    return apply_activation(y, attrs).reshape((*a.shape[:-1], w.shape[1]))


def _add_bias(y: np.ndarray, bias: np.ndarray) -> None:
    n = y.shape[-1] if y.ndim else 0
    if bias.ndim != 1 or n == 0 or bias.shape[0] != BIAS_ROWS * n or not y.flags.c_contiguous:
        y += bias
        return
    rows = y.size // n
    full = rows // BIAS_ROWS * BIAS_ROWS
    flat = y.reshape(-1)
    body = flat[: full * n].reshape(-1, BIAS_ROWS * n)
    np.add(body, bias, out=body)
    if full < rows:
        rest = flat[full * n :].reshape(-1, n)
        np.add(rest, bias[:n], out=rest)


def pack_fused_matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> dict[int, np.ndarray]:
    """The bias tiled BIAS_ROWS times, when the output is large enough for that to pay."""
    a, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if a is None or w is None or bias is None or bias.ndim != 1 or w.ndim < 1 or a.ndim < 1:
        return {}
    n = w.shape[-1]
    rows = math.prod(a.shape[:-1]) if w.ndim == 2 else 0
    if bias.shape[0] != n or rows < 2 * BIAS_ROWS or rows * n < TILED_BIAS_MIN_ELEMENTS:
        return {}
    return {2: np.tile(bias, BIAS_ROWS)}


fused_matmul.pack = pack_fused_matmul  # type: ignore[attr-defined]


@register("FusedAttention")
def fused_attention(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """softmax(q @ k^T * scale [+ mask]) @ v over the last axis, all heads in batched matmuls.

    Inputs q [..., S, D], k ([..., T, D], or [..., D, T] when ``k_transposed``), v [..., T, Dv],
    optional additive mask broadcastable to [..., S, T].  With ``views`` (the converter's
    folding of the head split), input i is read as the strided view ``views[i]`` of its buffer,
    and with ``out_view`` the result is written straight into the head-merged layout (see
    ``_strided``), so neither needs a copy.  The scores are computed transposed, [..., T, S],
    so the softmax reductions run down columns (elementwise over contiguous rows, several times
    faster than numpy's reductions along short rows); the scale goes on q, the smaller operand,
    and the normalising division on the [S, Dv] output instead of the scores.
    """
    q, keys, v, mask = _attention_inputs(inputs, attrs)
    exp = _softmax_exp(q, mask)
    if q.shape[-2] == 1:
        return [_attention_one_query(q, keys, v, mask, exp, attrs)]
    scores, total = _probabilities_transposed(q, keys, mask, exp)
    lead = np.broadcast_shapes(scores.shape[:-2], v.shape[:-2])  # v may add batch dims too
    result, out = _attention_output(attrs, (*lead, scores.shape[-1], v.shape[-1]), v.dtype)
    np.matmul(np.swapaxes(scores, -1, -2), v, out=out)
    _normalise(out, total)
    return [result]


def _normalise(out: np.ndarray, total: np.ndarray) -> None:
    """out /= total[..., None] as one dense divide by the sums repeated Dv times: a broadcast
    divide runs numpy's inner loop once per Dv-long row (e.g. 591 rows of 64), twice the time.
    The repeat must follow out's memory order: [..., H, S, Dv], or [..., S, H, Dv] (out_view)."""
    if total.shape == out.shape[:-1] and out.ndim >= 3:
        for view, sums in ((out, total), (np.swapaxes(out, -3, -2), np.swapaxes(total, -2, -1))):
            if view.flags.c_contiguous:
                flat = view.reshape(-1)  # a view, since contiguous
                flat /= np.repeat(sums, out.shape[-1])
                return
    out /= total[..., None]


def _probabilities_transposed(
    q: np.ndarray, keys: np.ndarray, mask: np.ndarray | None, exp: Any, shift: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """exp(scores - column max, or unshifted when that is safe) as [..., T, S], and its column
    sums [..., S]; ``shift`` forces the max shift."""
    mask_t = None if mask is None else np.swapaxes(mask.reshape((1,) * (2 - mask.ndim) + mask.shape), -1, -2)
    lead = np.broadcast_shapes(keys.shape[:-2], q.shape[:-2])
    t, s = keys.shape[-2], q.shape[-2]
    if mask_t is not None and np.broadcast_shapes((*lead, t, s), mask_t.shape) != (*lead, t, s):
        scores = np.matmul(keys, np.swapaxes(q, -1, -2)) + mask_t  # the mask adds batch dims
        scores -= scores.max(axis=-2, keepdims=True)
        exp(scores, out=scores)
        return scores, _column_sums(scores)
    # all heads' [T, S] scores side by side in one [T, heads * S] buffer: the column reductions
    # then run over rows heads times longer (numpy's cost is per row)
    rows = np.empty((t, *lead, s), dtype=np.result_type(keys, q))
    scores = np.moveaxis(rows, 0, -2)
    np.matmul(keys, np.swapaxes(q, -1, -2), out=scores)
    if mask_t is not None:
        scores += mask_t
    flat = rows.reshape(t, -1)
    shifted = shift or not _exp_safe_unshifted(flat, exp)
    if shifted:
        flat -= flat.max(axis=0)
    exp(flat, out=flat)
    total = _column_sums(flat)
    if not shifted and not total.min() >= UNSHIFTED_MIN_SUM:  # a column far below zero: redo it shifted
        return _probabilities_transposed(q, keys, mask, exp, shift=True)
    return scores, total.reshape(*lead, s)


# Softmax is shift-invariant: the column max is subtracted only to keep exp finite.  When every
# score is at most 64 (in the exp's own base) exp cannot overflow and the column sums stay far
# from float32's limits, so the max (a column reduction) and the subtraction (a broadcast pass)
# are skipped.  A column whose sum comes out below 2^-64 (all its scores very negative) would
# lose digits to underflow: then the scores are recomputed and shifted as usual.
UNSHIFTED_MAX_EXPONENT = 64.0
UNSHIFTED_MIN_SUM = 2.0**-64


def _exp_safe_unshifted(flat: np.ndarray, exp: Any) -> bool:
    # The limits above are float32's: float16 overflows at 2^16 and underflows at 2^-24.
    if flat.dtype.kind != "f" or flat.dtype.itemsize < 4 or flat.size == 0:
        return False
    limit = UNSHIFTED_MAX_EXPONENT if exp is fastmath.exp2 else UNSHIFTED_MAX_EXPONENT * math.log(2)
    return bool(flat.max() <= limit)  # False for NaN: the shifted path handles it as before


def _attention_one_query(
    q: np.ndarray, keys: np.ndarray, v: np.ndarray, mask: np.ndarray | None, exp: Any, attrs: dict[str, Any]
) -> np.ndarray:
    """A decode step (S = 1): the row layout, in the fewest numpy calls (their overhead is the
    cost at this size, not the passes).  The softmax runs on the scores as one 2-D [rows, T]
    view (numpy broadcasts over 4-D operands at twice the cost) with the row sums as a
    matrix-vector product (half the time of ``sum``)."""
    scores = np.matmul(q, np.swapaxes(keys, -1, -2))
    if mask is not None:
        scores = scores + mask
    rows = scores.reshape(-1, scores.shape[-1])  # a view: scores is a fresh C-ordered array
    rows -= rows.max(axis=1, keepdims=True)
    exp(rows, out=rows)
    rows /= np.dot(rows, ones_vector(rows.shape[1], rows.dtype))[:, None]
    result, out = _attention_output(attrs, (*scores.shape[:-2], 1, v.shape[-1]), v.dtype)
    np.matmul(scores, v, out=out)
    return result


def _column_sums(x: np.ndarray) -> np.ndarray:
    """x.sum(axis=-2) as a vector-matrix product: 3x faster than numpy's reduction here."""
    if x.dtype.kind != "f":
        return x.sum(axis=-2)
    return np.matmul(ones_vector(x.shape[-2], x.dtype), x)


def attention_per_head(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """FusedAttention one head at a time on 2-D matrices (each head's scores stay in cache
    through the softmax; a search candidate, as which wins depends on the head sizes).
    Falls back to the batched form with a mask."""
    q, keys, v, mask = _attention_inputs(inputs, attrs)
    if mask is not None:
        return fused_attention(inputs, attrs)
    exp = _softmax_exp(q, mask)
    lead = np.broadcast_shapes(q.shape[:-2], keys.shape[:-2], v.shape[:-2])
    q, keys, v = (np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in (q, keys, v))
    result, out = _attention_output(attrs, (*lead, q.shape[-2], v.shape[-1]), np.result_type(q, keys, v))
    for index in np.ndindex(*lead):
        scores = keys[index] @ q[index].T
        scores -= scores.max(axis=0)
        exp(scores, out=scores)
        total = _column_sums(scores)
        np.matmul(scores.T, v[index], out=out[index])
        out[index] /= total[:, None]
    return [result]


def attention_candidates(attrs: dict[str, Any], shapes: Sequence[tuple[int, ...] | None]) -> list[Kernel]:
    """The FusedAttention kernels a kernel search measures: batched and per head."""
    if len(shapes) > 3 and shapes[3] is not None:
        return [fused_attention]
    return [fused_attention, attention_per_head]


def _attention_inputs(
    inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """q already scaled, keys as [..., T, D], v, and the mask (or None)."""
    views = attrs.get("views") or [None, None, None]
    q, k, v = (_strided(x, spec) if spec else x for x, spec in zip(inputs[:3], views, strict=True))
    mask = inputs[3] if len(inputs) > 3 else None
    keys = np.swapaxes(k, -1, -2) if attrs.get("k_transposed", 0) else k
    scale = attrs.get("scale", 1.0) * (LOG2_E if _base2(q, mask) else 1.0)
    if attrs.get("q_log2e"):  # the converter folded log2(e) into q's projection already
        scale /= LOG2_E
    if scale != 1.0:
        q = q * q.dtype.type(scale)
    return q, keys, v, mask


# softmax(z) = 2^(z log2(e) - max) / sum: the log2(e) factor rides on the scale of q, and 2^x is
# np.exp2 where that is faster (half np.exp's time on AVX-512), else exp(x ln 2) (fastmath).
# Not with a mask, which would need scaling too.  With the attr ``q_log2e`` q arrives multiplied
# by log2(e) and by ``scale`` (the converter folds both into the q projection's weights), so the
# base-2 path needs no scaled copy of q at all.
LOG2_E = math.log2(math.e)


def _base2(q: np.ndarray, mask: np.ndarray | None) -> bool:
    return mask is None and q.dtype.kind == "f"


def _softmax_exp(q: np.ndarray, mask: np.ndarray | None) -> Any:
    return fastmath.exp2 if _base2(q, mask) else np.exp


def _attention_output(
    attrs: dict[str, Any], shape: tuple[int, ...], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The node's result, and the [..., S, Dv] array to write the attention into (a strided
    view of the result with ``out_view``, e.g. [B, H, S, Dv] inside a [B, S, H * Dv] result)."""
    spec = attrs.get("out_view")
    if not spec:
        out = np.empty(shape, dtype)
        return out, out
    result = np.empty([int(d) for d in spec["shape"]], dtype)
    out = _strided(result, spec["view"], writeable=True)
    if out.shape != shape or out.size != result.size or not _one_to_one(view_layout(spec["view"])):
        # every element of the (uninitialised) result must be written exactly once
        raise ValueError(f"FusedAttention out_view {out.shape} does not cover its result {shape} once")
    return result, out


def _one_to_one(layout: ViewLayout) -> bool:
    """Whether no two indices of the view reach the same element (strides nest, largest first)."""
    dims = sorted((s, n) for s, n in zip(layout.strides, layout.shape, strict=True) if n > 1)
    reach = 1
    for stride, count in dims:
        if stride < reach:
            return False
        reach = stride * count
    return True


@dataclass(frozen=True)
class ViewLayout:
    """A checked view spec, in elements: made once per node at load (``prepare_attention``),
    since checking and converting the JSON spec costs ~3 us, a tenth of a decode step's attention."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    high: int  # the highest flat index the view touches


def view_layout(spec: dict[str, Any] | ViewLayout) -> ViewLayout:
    """The checked layout of a view spec ({"shape", "offset", "strides"} in elements)."""
    if isinstance(spec, ViewLayout):
        return spec
    shape, strides = tuple(int(d) for d in spec["shape"]), tuple(int(s) for s in spec["strides"])
    offset = int(spec["offset"])
    if min(strides, default=0) < 0 or len(strides) != len(shape):
        raise ValueError(f"FusedAttention view strides {list(strides)} must be non-negative, one per dim")
    if 0 in shape or offset < 0:
        raise ValueError(f"FusedAttention view {spec} is empty or starts before its input")
    high = offset + sum(s * (n - 1) for s, n in zip(strides, shape, strict=True))
    return ViewLayout(shape, strides, offset, high)


@prepare("FusedAttention")
def prepare_attention(attrs: dict[str, Any], n_inputs: int, n_outputs: int) -> dict[str, Any]:
    """View specs checked and converted once at load; a bad one is left for the run to report
    (naming the node) rather than failing the whole load."""
    try:
        prepared = dict(attrs)
        if attrs.get("views"):
            prepared["views"] = [view_layout(spec) if spec else None for spec in attrs["views"]]
        if attrs.get("out_view"):
            prepared["out_view"] = {**attrs["out_view"], "view": view_layout(attrs["out_view"]["view"])}
        return prepared
    except (KeyError, TypeError, ValueError):
        return attrs


def _strided(x: np.ndarray, spec: dict[str, Any] | ViewLayout, writeable: bool = False) -> np.ndarray:
    """The view ``spec`` (elements over x's C-order flat index) of ``x``, checked to stay inside it."""
    layout = view_layout(spec)
    if writeable and not x.flags.c_contiguous:
        raise ValueError("FusedAttention can only write a view into a contiguous result")
    flat = x.reshape(-1)  # a copy exactly when x is not contiguous (then never written to)
    if layout.high >= flat.size:
        raise ValueError(f"FusedAttention view {spec} does not fit an input of {flat.size} elements")
    size = x.dtype.itemsize
    strides = tuple(s * size for s in layout.strides)
    return np.ndarray(layout.shape, x.dtype, flat, layout.offset * size, strides)
