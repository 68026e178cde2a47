"""The Llama-family decoder: prefill (BLAS, in blocks) and cached decode (the kernel layer's GEMV).

Per layer, for hidden states x at positions p.. (transformers' LlamaDecoderLayer):
    a = RMSNorm(x); q, k, v = a Wq^T (+bq), a Wk^T (+bk), a Wv^T (+bv); RoPE on q and k;
    attention over the cache with a causal mask, query head h reading kv head h // (H / KV);
    x += o Wo^T (+bo); b = RMSNorm(x); x += (silu(b Wg^T) * (b Wu^T)) Wd^T
then logits = RMSNorm(x) Wlm^T.  q, k and v are one matrix, gate and up another (one GEMV
each per token instead of three and two).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine import batch_split, jit
from engine.llm import aot, gemv
from engine.llm import spread as llm_spread
from engine.llm.attention import causal_softmax_numpy
from engine.llm.cache import KVCache
from engine.llm.checkpoint import Checkpoint
from engine.llm.config import LlmConfig
from engine.llm.lora import LoraAdapter, LowRank
from engine.llm.weights import Matrix, gemv_kernel, make_matrix

PREFILL_BLOCK = 256  # tokens per prefill step: bounds the activations' scratch


@dataclass
class Layer:
    input_norm: np.ndarray
    post_norm: np.ndarray
    qkv: Matrix
    qkv_bias: np.ndarray | None
    o: Matrix
    o_bias: np.ndarray | None
    gate_up: Matrix
    down: Matrix


@dataclass
class LlmWeights:
    embed: Matrix
    lm_head: Matrix  # the same object as ``embed`` when tied
    norm: np.ndarray
    layers: list[Layer]

    @property
    def nbytes(self) -> int:
        own = (
            self.embed.nbytes + (0 if self.lm_head is self.embed else self.lm_head.nbytes) + self.norm.nbytes
        )
        for layer in self.layers:
            for m in (layer.qkv, layer.o, layer.gate_up, layer.down):
                own += m.nbytes
        return own


def weights_from_checkpoint(checkpoint: Checkpoint, precision: str = "fp32", block: int = 32) -> LlmWeights:
    """The checkpoint's tensors stored at ``precision`` (embedding and LM head included)."""
    t, config = checkpoint.tensors, checkpoint.config

    def f32(name: str) -> np.ndarray:
        return np.ascontiguousarray(t[name], np.float32)

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        qkv = np.concatenate([f32(a + n + "_proj.weight") for n in "qkv"])
        bias = np.concatenate([f32(a + n + "_proj.bias") for n in "qkv"]) if config.qkv_bias else None
        gate_up = np.concatenate([f32(p + "mlp.gate_proj.weight"), f32(p + "mlp.up_proj.weight")])
        layers.append(
            Layer(
                input_norm=f32(p + "input_layernorm.weight"),
                post_norm=f32(p + "post_attention_layernorm.weight"),
                qkv=make_matrix(qkv, precision, block),
                qkv_bias=bias,
                o=make_matrix(f32(a + "o_proj.weight"), precision, block),
                o_bias=f32(a + "o_proj.bias") if config.o_bias else None,
                gate_up=make_matrix(gate_up, precision, block),
                down=make_matrix(f32(p + "mlp.down_proj.weight"), precision, block),
            )
        )
    embed = make_matrix(t["model.embed_tokens.weight"], precision, block)
    head = embed if config.tie_word_embeddings else make_matrix(t["lm_head.weight"], precision, block)
    return LlmWeights(embed=embed, lm_head=head, norm=f32("model.norm.weight"), layers=layers)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.einsum("ij,ij->i", x, x) / x.shape[-1]
    return x * (1.0 / np.sqrt(variance + eps)).astype(np.float32)[:, None] * weight


class LlmModel:
    """Runs a decoder over a ``KVCache``: ``forward(tokens, cache)`` appends the tokens and
    returns logits (the last position's, or every position's with ``all_logits``)."""

    def __init__(self, config: LlmConfig, weights: LlmWeights) -> None:
        self.config, self.weights = config, weights
        self._inv_freq = config.inv_freq()
        self._scale = np.float32(1.0 / np.sqrt(config.head_dim))
        self._decode_attention = None
        # decode through layer_jit's fused kernels when the JIT tier is on (False: the per-op
        # path, for comparisons); their scratch is per thread, so threads may share a model
        self.fused_decode = True
        self._local = threading.local()

    def new_cache(self, context: int | None = None, kind: str = "fp32") -> KVCache:
        """A cache of ``context`` positions (default: the model's), "fp32" or "int8" (cache.py)."""
        return KVCache(self.config, context, kind)

    def forward(
        self,
        tokens: list[int] | np.ndarray,
        cache: KVCache,
        all_logits: bool = False,
        adapter: LoraAdapter | None = None,
    ) -> np.ndarray:
        """``adapter``: a LoRA applied as a low-rank add (a cache must not mix adapters)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise ValueError(
                f"token ids must be in [0, {self.config.vocab_size}); got {tokens.min()}..{tokens.max()}"
            )
        cache.reserve(tokens.size)
        fused = self._decode_buffers() if tokens.size == 1 and adapter is None else None
        if fused is not None:  # decode: the JIT layer kernels (engine/llm/layer_jit.py)
            logits = self._decode(int(tokens[0]), cache, fused)
            return logits[None, :] if all_logits else logits
        outputs = []
        for start in range(0, tokens.size, PREFILL_BLOCK):
            hidden = self._step(tokens[start : start + PREFILL_BLOCK], cache, adapter)
            outputs.append(hidden if all_logits else hidden[-1:])
        hidden = np.concatenate(outputs) if all_logits else outputs[-1]
        normed = rms_norm(hidden, self.weights.norm, self.config.rms_norm_eps)
        head = self.weights.lm_head
        logits = head.gemv(normed[0])[None, :] if len(normed) == 1 else head.gemm(normed)
        return logits if all_logits else logits[0]

    def _step(self, tokens: np.ndarray, cache: KVCache, adapter: LoraAdapter | None) -> np.ndarray:
        """Run a block of tokens through every layer, appending to the cache; the hidden states.

        With several threads the block's rows are cut into parts (``row_parts``) and each layer
        runs in two phases over them, taken in turn by the caller and pool threads
        (``batch_split.share_out``): up to the cache write, then from attention on (a part's
        queries need every earlier part's keys).  Every operation is per row, so each part runs
        the one-thread kernels; a pool thread that wakes late costs one part, not a layer."""
        c = self.config
        start, m = cache.length, tokens.size
        x = np.array(self.weights.embed.rows(tokens), np.float32)  # updated in place, row by row
        angles = np.arange(start, start + m, dtype=np.float64)[:, None] * self._inv_freq[None, :]
        rotation = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        q = np.empty((m, c.num_heads, c.head_dim), np.float32)
        threads = jit.threads() if jit.enabled() else 1  # numpy-only: BLAS spreads each product
        parts = row_parts(m, threads)
        for index, layer in enumerate(self.weights.layers):
            delta = adapter.layers[index] if adapter is not None else {}
            step = _LayerStep(self, layer, index, delta, cache, start, x, q, rotation)
            _each_part(step.project_in, parts, threads)
            # the last rows attend over the most keys: handed out first
            _each_part(step.attend_out, parts[::-1], threads)
        cache.record(start, tokens)
        return x

    def _decode_buffers(self) -> DecodeBuffers | None:
        """This thread's buffers for the fused decode path, made once; None when it is off."""
        if not (self.fused_decode and jit.enabled()):
            return None
        found = getattr(self._local, "fused", None)
        if found is None:
            # the ahead-of-time extension when built (no numba in this process), else numba's
            kernels = aot.kernels() or jit.module("engine.llm.layer_jit")
            found = self._local.fused = DecodeBuffers(self.config, self.weights, kernels)
        return found

    def _decode(self, token: int, cache: KVCache, fused: DecodeBuffers) -> np.ndarray:
        """One token through every layer with the fused kernels (``_step``'s m == 1 twin); its logits."""
        c, k, layers = self.config, fused.kernels, self.weights.layers
        start = cache.length
        angles = start * self._inv_freq
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        x, a, empty = fused.x, fused.a, fused.empty
        x[:] = self.weights.embed.rows(np.array([token]))[0]
        k.add_norm(x, empty, empty, layers[0].input_norm, c.rms_norm_eps, a)
        threads = jit.threads()
        spread = fused.spread if threads > 1 and cache.kind == "fp32" else None
        if spread is not None:  # every layer shared by the threads (spread.py)
            buffers = (x, a, fused.q, *fused.scratch)
            rope_at = (cos, sin, c.num_kv_heads, start, self._scale)
            llm_spread.run_token(
                fused.spread_kernels, spread, (c.rms_norm_eps, rope_at, cache.data, buffers), threads
            )
            cache.record(start, np.array([token], np.int64))
            return spread.logits.copy() if spread.logits.size else self.weights.lm_head.gemv(a)
        rope = (cos, sin, c.num_kv_heads, start, self._scale, fused.q)
        for index, layer in enumerate(layers):
            after = layers[index + 1].input_norm if index + 1 < len(layers) else self.weights.norm
            arrays = cache.decode_inputs(index)
            head = fused.one_call[index]
            if head is not None:  # the whole layer in one call
                kernel = k.layer if len(arrays) == 2 else k.layer_int8_cache
                kernel(x, a, *head, layer.post_norm, after, c.rms_norm_eps, *rope, *arrays, *fused.scratch)
            else:
                self._decode_layer(layer, after, arrays, rope, fused)
        cache.record(start, np.array([token], np.int64))
        return self.weights.lm_head.gemv(a)

    def _decode_layer(
        self, layer: Layer, after: np.ndarray, arrays: list[np.ndarray], rope: tuple, fused: DecodeBuffers
    ) -> None:
        """One layer, its GEMVs through ``Matrix.gemv`` (any precision) and the rest fused."""
        k, eps, x, a, empty = fused.kernels, self.config.rms_norm_eps, fused.x, fused.a, fused.empty
        qkv = layer.qkv.gemv(a)
        bias = empty if layer.qkv_bias is None else layer.qkv_bias
        attend = k.attend if len(arrays) == 2 else k.attend_int8
        attend(qkv, bias, *rope, *arrays, fused.attended)
        o_bias = empty if layer.o_bias is None else layer.o_bias
        k.add_norm(x, layer.o.gemv(fused.attended), o_bias, layer.post_norm, eps, a)
        k.swiglu(layer.gate_up.gemv(a), fused.hidden)
        k.add_norm(x, layer.down.gemv(fused.hidden), empty, after, eps, a)

    def _attention(self, q: np.ndarray, cache: KVCache, index: int, start: int, m: int) -> np.ndarray:
        """Causal grouped-query attention of m queries at positions start.. over the cache."""
        c = self.config
        if m == 1:  # decode: one kernel call per layer (engine/llm/attention_jit.py)
            if self._decode_attention is None:
                self._decode_attention = gemv_kernel("LlmDecodeAttention")
            inputs = [q[0], *cache.decode_inputs(index)]
            return self._decode_attention(inputs, {"total": start + 1, "scale": self._scale})[0][None, :]
        group = c.num_heads // c.num_kv_heads
        total = start + m
        keys, values = cache.read(index, total)  # what the cache holds (int8: dequantized)
        # [m, H, d] -> [KV, group * m, d], scaled: a kv head's queries side by side
        grouped = (q.reshape(m, c.num_kv_heads, group, c.head_dim) * self._scale).transpose(1, 2, 0, 3)
        grouped = grouped.reshape(c.num_kv_heads, group * m, c.head_dim)
        scores = np.empty((c.num_kv_heads, group * m, total), np.float32)
        for g in range(c.num_kv_heads):  # 2-D products: numpy's stacked matmul over the keys'
            np.matmul(grouped[g], keys[g].T, out=scores[g])  # transpose misses BLAS's gemm (4x)
        _causal_softmax(scores, m, start)
        out = np.matmul(scores, values).reshape(c.num_kv_heads, group, m, c.head_dim)
        return np.ascontiguousarray(out.transpose(2, 0, 1, 3).reshape(m, c.num_heads * c.head_dim))


def _causal_softmax(scores: np.ndarray, m: int, start: int) -> None:
    """Softmax in place of scores [KV, group * m, total] for m queries at positions start..,
    each over the keys its query sees (attention_jit.causal_softmax, the AOT build's when
    loaded); numpy's masked softmax without the JIT tier."""
    if jit.enabled():
        kernels = aot.kernels() or jit.module("engine.llm.attention_jit")
        kernels.causal_softmax(scores, m, start)
    else:
        causal_softmax_numpy(scores, m, start)


def _swiglu(gate_up: np.ndarray, size: int) -> np.ndarray:
    """silu(gate) * up of gate_up [m, 2 * size] = [gate, up] (layer_jit.swiglu_rows with the
    JIT tier, the AOT build's when loaded)."""
    if not jit.enabled():
        gate, up = gate_up[:, :size], gate_up[:, size:]
        return gate / (1.0 + np.exp(-gate)) * up
    out = np.empty((gate_up.shape[0], size), np.float32)
    (aot.kernels() or jit.module("engine.llm.layer_jit")).swiglu_rows(np.ascontiguousarray(gate_up), out)
    return out


MIN_PART_ROWS = 32  # rows of a prefill part: smaller parts re-read the weights for little work


def row_parts(m: int, threads: int) -> list[slice]:
    """A prefill block's rows as parts for ``threads`` threads: one part on one thread or for a
    short block, else about two parts per thread (a late pool thread holds up one), cut at
    multiples of 8 (the integer GEMMs' token tile)."""
    count = min(2 * threads, m // MIN_PART_ROWS) if threads > 1 else 1
    if count < 2:
        return [slice(0, m)]
    size = ((m + count - 1) // count + 7) // 8 * 8
    return [slice(r, min(r + size, m)) for r in range(0, m, size)]


def _each_part(run: Any, parts: list[slice], threads: int) -> None:
    """``run(part)`` for every part, on one-thread kernels: here, or shared out over threads."""
    if len(parts) == 1:
        run(parts[0])
        return

    def one(rows: slice) -> None:
        with jit.thread_limit(1):
            run(rows)

    batch_split.share_out(one, parts, threads)


class _LayerStep:
    """One layer of a prefill block, run part by part (``LlmModel._step``)."""

    def __init__(
        self,
        model: LlmModel,
        layer: Layer,
        index: int,
        delta: dict[str, LowRank],
        cache: KVCache,
        start: int,
        x: np.ndarray,
        q: np.ndarray,
        rotation: tuple[np.ndarray, np.ndarray],
    ) -> None:
        self.model, self.layer, self.index, self.delta, self.cache = model, layer, index, delta, cache
        self.start, self.x, self.q, self.rotation = start, x, q, rotation

    def project_in(self, rows: slice) -> None:
        """Norm, the q/k/v projection and RoPE for ``rows``; keys and values into the cache."""
        c, layer = self.model.config, self.layer
        m = rows.stop - rows.start
        cos, sin = self.rotation[0][rows], self.rotation[1][rows]
        a = rms_norm(self.x[rows], layer.input_norm, c.rms_norm_eps)
        qkv = _project(layer.qkv, a, layer.qkv_bias, self.delta.get("qkv"))
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.q[rows] = _rope(qkv[:, :q_size].reshape(m, c.num_heads, c.head_dim), cos, sin)
        k = _rope(qkv[:, q_size : q_size + kv_size].reshape(m, c.num_kv_heads, c.head_dim), cos, sin)
        v = qkv[:, q_size + kv_size :].reshape(m, c.num_kv_heads, c.head_dim)
        self.cache.write(self.index, self.start + rows.start, k, v)

    def attend_out(self, rows: slice) -> None:
        """Attention for ``rows``' queries, the output projection and the MLP, into x's rows."""
        c, layer, delta = self.model.config, self.layer, self.delta
        m = rows.stop - rows.start
        attended = self.model._attention(self.q[rows], self.cache, self.index, self.start + rows.start, m)
        x = self.x[rows]  # a view: the updates land in the block's hidden states
        x += _project(layer.o, attended, layer.o_bias, delta.get("o"))
        b = rms_norm(x, layer.post_norm, c.rms_norm_eps)
        gate_up = _project(layer.gate_up, b, None, delta.get("gate_up"))
        x += _project(layer.down, _swiglu(gate_up, c.intermediate_size), None, delta.get("down"))


class DecodeBuffers:
    """Per-model scratch of the fused decode path, allocated once (not per step), and each
    layer's matrices as layer_jit's one-call kernel takes them (``one_call``; None for a layer
    whose GEMVs go through ``Matrix.gemv``)."""

    def __init__(self, config: LlmConfig, weights: LlmWeights, kernels: ModuleType) -> None:
        hidden, d = config.hidden_size, config.head_dim
        self.kernels: Any = kernels
        self.x = np.empty(hidden, np.float32)  # the residual stream
        self.a = np.empty(hidden, np.float32)  # its normalized form, the next GEMV's input
        self.q = np.empty((config.num_heads, d), np.float32)
        self.attended = np.empty(config.num_heads * d, np.float32)
        self.hidden = np.empty(config.intermediate_size, np.float32)
        self.empty = np.empty(0, np.float32)  # "no bias"
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * d
        outputs = (qkv_size, 0, hidden, 2 * config.intermediate_size, 0, hidden)
        scratch = [np.empty(n, np.float32) for n in outputs]
        scratch[1], scratch[4] = self.attended, self.hidden
        self.scratch = (*scratch, self.empty)
        self.one_call = _one_call_layers(weights, self.empty)
        self._config, self._weights = config, weights

    @functools.cached_property
    def spread(self) -> llm_spread.SpreadTables | None:
        """spread.py's tables for several threads, made at the first such token; None where a
        layer is not int8 or int4 on the dot layouts, all of one kind."""
        layers = self.one_call
        kinds = {None if layer is None else (layer[0].ndim, layer[1].dtype) for layer in layers}
        if kinds not in ({(1, np.dtype(np.float32))}, {(1, np.dtype(np.uint16))}):
            return None
        config, weights = self._config, self._weights
        after = [layer.input_norm for layer in weights.layers[1:]] + [weights.norm]
        floats = [
            f
            for layer, one_call, next_norm in zip(weights.layers, layers, after, strict=True)
            for f in (layer.post_norm, next_norm, *one_call[10:12])
        ]
        widest = max(config.hidden_size, config.num_heads * config.head_dim, config.intermediate_size)
        head = _one_call_head(weights.lm_head, layers[0])
        return llm_spread.tables(layers, floats, widest, head)

    @functools.cached_property
    def spread_kernels(self) -> Any:
        """token_open / token_work: the AOT extension's when this model's kernels are, else numba's."""
        if hasattr(self.kernels, "token_work"):
            return self.kernels
        return jit.module("engine.llm.spread_jit")


def _one_call_layers(weights: LlmWeights, empty: np.ndarray) -> list[tuple | None]:
    """Per layer: (its four matrices as layer_jit's ``layer`` takes them, block, group, qkv bias,
    o bias), or None for a layer whose matrices are not all the converter's int4 (int8
    activations, float16 scales, one block; each its own group, all in the dot layout or none)
    or all int8 per-channel (all in the int8 dot layout or none)."""
    found: list[tuple | None] = []
    for layer in weights.layers:
        matrices = (layer.qkv, layer.o, layer.gate_up, layer.down)
        first = matrices[0]
        biases = tuple(empty if b is None else b for b in (layer.qkv_bias, layer.o_bias))
        dot = {m.group == gemv.DOT_GROUP for m in matrices}
        if all(_is_q4(m, first.block) for m in matrices) and len(dot) == 1:
            arrays = [array for m in matrices for array in _q4_arrays(m)]
            found.append((*arrays, first.block, first.group, *biases))
        elif all(m.kind == "int8" for m in matrices) and len(dot) == 1:
            # the int8 dot layout flat (layer_jit tells it from int4's by the scales' type)
            arrays = [_int8_array(m, part) for m in matrices for part in ("q", "scale")]
            found.append((*arrays, 0, 0, *biases))
        else:
            found.append(None)
    return found


def _one_call_head(head: Matrix, first: tuple) -> tuple | None:
    """The LM head as (weights, scales, rows) when it is of the one-call layers' kind (``first``:
    one of them), so spread.py can share it out with them; else None."""
    dot = head.group == gemv.DOT_GROUP
    if dot and first[1].dtype == np.float32 and head.kind == "int8":
        return _int8_array(head, "q"), _int8_array(head, "scale"), head.arrays["q"].shape[0]
    if dot and first[1].dtype == np.uint16 and _is_q4(head, int(first[8])):
        return (*_q4_arrays(head), head.arrays["q"].shape[0])
    return None


def _int8_array(matrix: Matrix, part: str) -> np.ndarray:
    """A plain ndarray view of an int8 matrix's ``part``, flat for the int8 dot layout's bytes."""
    array = np.asarray(matrix.arrays[part]).view(np.ndarray)
    return array.reshape(-1) if matrix.group == gemv.DOT_GROUP and part == "q" else array


def _is_q4(matrix: Matrix, block: int) -> bool:
    """The converter's int4 at ``block``; groups may differ per matrix (the kernel reads each
    one's from its shapes)."""
    return (
        matrix.kind == "int4"
        and matrix.activations == "int8"
        and matrix.arrays["scale"].dtype == np.float16
        and matrix.group > 1
        and matrix.block == block
    )


def _q4_arrays(matrix: Matrix) -> tuple[np.ndarray, np.ndarray]:
    """gemv_int4_jit's views of a grouped int4 matrix (plain ndarrays, made once: a reshape of a
    package's memmap runs numpy's Python-level memmap hooks on every call); flat for the dot
    layout (layer_jit's kernels tell the layouts apart by their dimensions)."""
    n, half_k = matrix.arrays["q"].shape
    if matrix.group == gemv.DOT_GROUP:
        flat = np.asarray(matrix.arrays["q"]).view(np.ndarray).reshape(-1)
        return flat, np.asarray(matrix.arrays["scale"]).view(np.uint16).view(np.ndarray).reshape(-1)
    lanes = matrix.group * half_k * 2 // matrix.block
    packed = (
        np.asarray(matrix.arrays["q"]).view(np.ndarray).reshape(n // matrix.group, matrix.block // 2, lanes)
    )
    halves = (
        np.asarray(matrix.arrays["scale"]).view(np.uint16).view(np.ndarray).reshape(n // matrix.group, lanes)
    )
    return packed, halves


def _project(matrix: Matrix, x: np.ndarray, bias: np.ndarray | None, delta: LowRank | None) -> np.ndarray:
    out = matrix.gemv(x[0])[None, :] if x.shape[0] == 1 else matrix.gemm(x)
    if delta is not None:
        out = delta.add_to(out, x)
    return out + bias if bias is not None else out


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate halves (transformers' rotate_half form): x [m, heads, d], cos/sin [m, d/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
