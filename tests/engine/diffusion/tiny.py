"""A tiny Stable-Diffusion-style pipeline built with onnx.helper, in diffusers' ONNX layout
(text_encoder/, unet/, vae_decoder/, tokenizer/, scheduler/): a one-layer CLIP-style text
encoder, a UNet with one down and one up block (ResNet blocks with GroupNorm and the timestep
embedding, a transformer block with self- and cross-attention and a GEGLU feed-forward) and a
small VAE decoder (GroupNorm, a mid attention, three 2x upsamplings).  Random seeded weights;
everything is built here, nothing is downloaded."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21  # GroupNormalization with per-channel scale and bias
MAX_LENGTH = 8  # the tokenizer's (and the position embedding's) length
TEXT_WIDTH = 32  # the text encoder's hidden size = the UNet's cross-attention width
LATENT = 4
WORDS = ["a", "cat", "the", "ferry", "red", "boat", "on", "sea"]
SCHEDULER = {
    "_class_name": "PNDMScheduler",
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "clip_sample": False,
}


class Graph:
    """Nodes and seeded random initializers, one call per layer."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape: tuple[int, ...], scale: float | None = None, hint: str = "w") -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        std = scale if scale is not None else 1.0 / math.sqrt(max(fan_in, 1))
        return self.const((self.rng.standard_normal(shape) * std).astype(np.float32), hint)

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, x: str, d_in: int, d_out: int, bias: bool = True) -> str:
        w = self.const((self.rng.standard_normal((d_in, d_out)) / math.sqrt(d_in)).astype(np.float32))
        y = self.op("MatMul", [x, w])
        if bias:
            y = self.op("Add", [y, self.weight((d_out,), 0.1, "b")])
        return y

    def conv(self, x: str, c_in: int, c_out: int, k: int = 3, stride: int = 1) -> str:
        pad = k // 2
        return self.op(
            "Conv",
            [x, self.weight((c_out, c_in, k, k)), self.weight((c_out,), 0.1, "b")],
            kernel_shape=[k, k],
            pads=[pad] * 4,
            strides=[stride, stride],
        )

    def group_norm(self, x: str, c: int, groups: int = 4, eps: float = 1e-5) -> str:
        scale = self.const((1 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        bias = self.weight((c,), 0.1, "b")
        return self.op("GroupNormalization", [x, scale, bias], num_groups=groups, epsilon=eps)

    def layer_norm(self, x: str, d: int) -> str:
        scale = self.const((1 + 0.1 * self.rng.standard_normal(d)).astype(np.float32))
        return self.op("LayerNormalization", [x, scale, self.weight((d,), 0.1, "b")], axis=-1, epsilon=1e-5)

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def gelu(self, x: str) -> str:  # the erf form torch exports
        inner = self.op("Erf", [self.op("Div", [x, self.const(np.float32(math.sqrt(2)))])])
        half = self.op("Mul", [x, self.op("Add", [inner, self.const(np.float32(1))])])
        return self.op("Mul", [half, self.const(np.float32(0.5))])

    def attention(self, x: str, context: str, d: int, d_ctx: int, heads: int, mask: str | None = None) -> str:
        hd = d // heads
        q = self.linear(x, d, d, bias=False)
        k = self.linear(context, d_ctx, d, bias=False)
        v = self.linear(context, d_ctx, d, bias=False)
        split = self.const(np.array([0, -1, heads, hd], np.int64))
        q, k, v = (self.op("Reshape", [t, split]) for t in (q, k, v))
        q = self.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = self.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = self.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = self.op("Mul", [self.op("MatMul", [q, k]), self.const(np.float32(1 / math.sqrt(hd)))])
        if mask is not None:
            scores = self.op("Add", [scores, mask])
        out = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        out = self.op("Transpose", [out], perm=[0, 2, 1, 3])
        out = self.op("Reshape", [out, self.const(np.array([0, -1, d], np.int64))])
        return self.linear(out, d, d)

    def model(self, inputs: list, outputs: list, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tiny")
        model.ir_version = 10
        onnx.checker.check_model(model, full_check=True)
        return model


def text_encoder(vocab: int, seed: int = 1) -> onnx.ModelProto:
    g, d = Graph(seed), TEXT_WIDTH
    x = g.op("Gather", [g.weight((vocab, d), 0.5, "token_embedding"), "input_ids"])
    x = g.op("Add", [x, g.weight((MAX_LENGTH, d), 0.5, "position_embedding")])
    causal = np.triu(np.full((MAX_LENGTH, MAX_LENGTH), np.finfo(np.float32).min, np.float32), 1)
    h = g.layer_norm(x, d)
    x = g.op("Add", [x, g.attention(h, h, d, d, heads=2, mask=g.const(causal, "causal_mask"))])
    h = g.linear(g.layer_norm(x, d), d, 4 * d)
    h = g.op("Mul", [h, g.op("Sigmoid", [g.op("Mul", [h, g.const(np.float32(1.702))])])])  # quick GELU
    x = g.op("Add", [x, g.linear(h, 4 * d, d)])
    last = g.layer_norm(x, d)
    g.nodes.append(helper.make_node("Identity", [last], ["last_hidden_state"]))
    pooled = g.op("ReduceMean", [last, g.const(np.array([1], np.int64))], keepdims=0)
    g.nodes.append(helper.make_node("Identity", [pooled], ["pooler_output"]))
    return g.model(
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", MAX_LENGTH])],
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", MAX_LENGTH, d]),
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", d]),
        ],
        "text_encoder",
    )


def _resnet(g: Graph, x: str, c_in: int, c_out: int, temb: str | None, t_dim: int) -> str:
    h = g.conv(g.silu(g.group_norm(x, c_in)), c_in, c_out)
    if temb is not None:
        t = g.linear(g.silu(temb), t_dim, c_out)
        h = g.op("Add", [h, g.op("Unsqueeze", [t, g.const(np.array([2, 3], np.int64))])])
    h = g.conv(g.silu(g.group_norm(h, c_out)), c_out, c_out)
    skip = x if c_in == c_out else g.conv(x, c_in, c_out, k=1)
    return g.op("Add", [skip, h])


def _transformer(g: Graph, x: str, c: int, context: str, heads: int = 2) -> str:
    shape = g.op("Shape", [x])
    h = g.conv(g.group_norm(x, c, eps=1e-6), c, c, k=1)  # proj_in
    h = g.op("Transpose", [g.op("Reshape", [h, g.const(np.array([0, c, -1], np.int64))])], perm=[0, 2, 1])
    n = g.layer_norm(h, c)
    h = g.op("Add", [h, g.attention(n, n, c, c, heads)])
    h = g.op("Add", [h, g.attention(g.layer_norm(h, c), context, c, TEXT_WIDTH, heads)])
    sizes = g.const(np.array([4 * c, 4 * c], np.int64))
    hidden, gate = g.op("Split", [g.linear(g.layer_norm(h, c), c, 8 * c), sizes], outputs=2, axis=-1)
    h = g.op("Add", [h, g.linear(g.op("Mul", [hidden, g.gelu(gate)]), 4 * c, c)])  # GEGLU
    h = g.op("Reshape", [g.op("Transpose", [h], perm=[0, 2, 1]), shape])
    return g.op("Add", [x, g.conv(h, c, c, k=1)])  # proj_out


def _upsample(g: Graph, x: str, c: int, c_out: int | None = None) -> str:
    scales = g.const(np.array([1, 1, 2, 2], np.float32))
    up = g.op("Resize", [x, "", scales], mode="nearest")
    return g.conv(up, c, c_out or c)


def unet(seed: int = 2, channels: int = 16) -> onnx.ModelProto:
    g, c, t_dim = Graph(seed), channels, 2 * channels
    half = c // 2
    freqs = np.exp(-math.log(10000) * np.arange(half, dtype=np.float32) / half).astype(np.float32)
    t = g.op("Cast", ["timestep"], to=TensorProto.FLOAT)
    t = g.op("Unsqueeze", [t, g.const(np.array([1], np.int64))])
    angles = g.op("Mul", [t, g.const(freqs[None, :], "freqs")])
    emb = g.op("Concat", [g.op("Cos", [angles]), g.op("Sin", [angles])], axis=1)  # flip_sin_to_cos
    temb = g.linear(g.silu(g.linear(emb, c, t_dim)), t_dim, t_dim)
    h = g.conv("sample", LATENT, c)
    h = _transformer(g, _resnet(g, h, c, c, temb, t_dim), c, "encoder_hidden_states")
    skip = h
    h = g.conv(h, c, c, stride=2)  # down
    h = _resnet(g, h, c, 2 * c, temb, t_dim)  # mid, at half size
    h = _upsample(g, h, 2 * c)
    h = g.op("Concat", [h, skip], axis=1)
    h = _transformer(g, _resnet(g, h, 3 * c, c, temb, t_dim), c, "encoder_hidden_states")
    out = g.conv(g.silu(g.group_norm(h, c)), c, LATENT)
    g.nodes.append(helper.make_node("Identity", [out], ["out_sample"]))
    return g.model(
        [
            helper.make_tensor_value_info("sample", TensorProto.FLOAT, ["batch", LATENT, "height", "width"]),
            helper.make_tensor_value_info("timestep", TensorProto.INT64, ["steps"]),
            helper.make_tensor_value_info(
                "encoder_hidden_states", TensorProto.FLOAT, ["batch", MAX_LENGTH, TEXT_WIDTH]
            ),
        ],
        [helper.make_tensor_value_info("out_sample", TensorProto.FLOAT, ["batch", LATENT, "h", "w"])],
        "unet",
    )


def vae_decoder(seed: int = 3, channels: int = 16) -> onnx.ModelProto:
    g, c = Graph(seed), channels
    h = g.conv(g.conv("latent_sample", LATENT, LATENT, k=1), LATENT, c)  # post_quant_conv, conv_in
    h = _resnet(g, h, c, c, None, 0)
    shape = g.op("Shape", [h])  # the mid block's single-head attention over positions
    n = g.op("Reshape", [g.group_norm(h, c), g.const(np.array([0, c, -1], np.int64))])
    n = g.op("Transpose", [n], perm=[0, 2, 1])
    a = g.attention(n, n, c, c, heads=1)
    h = g.op("Add", [h, g.op("Reshape", [g.op("Transpose", [a], perm=[0, 2, 1]), shape])])
    for _ in range(3):
        h = _upsample(g, h, c)
    out = g.conv(g.silu(g.group_norm(h, c)), c, 3)
    g.nodes.append(helper.make_node("Identity", [out], ["sample"]))
    return g.model(
        [helper.make_tensor_value_info("latent_sample", TensorProto.FLOAT, ["batch", LATENT, "h", "w"])],
        [helper.make_tensor_value_info("sample", TensorProto.FLOAT, ["batch", 3, "H", "W"])],
        "vae_decoder",
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's byte-to-printable-character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


def tokenizer_files() -> dict[str, str]:
    """vocab.json, merges.txt and tokenizer_config.json of a small CLIP-style BPE."""
    symbols = list(_bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols]
    merges = []
    for word in WORDS:
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            if pieces[0] not in vocab:
                vocab.append(pieces[0])
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    config = {"model_max_length": MAX_LENGTH, "pad_token": "<|endoftext|>", "bos_token": "<|startoftext|>"}
    return {
        "vocab.json": json.dumps({token: i for i, token in enumerate(vocab)}),
        "merges.txt": "#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n",
        "tokenizer_config.json": json.dumps(config),
    }


def vocab_size() -> int:
    return len(json.loads(tokenizer_files()["vocab.json"]))


def write_layout(root: Path, *, unet_model: onnx.ModelProto | None = None) -> Path:
    """The whole layout under ``root`` (as diffusers' ONNX export / optimum writes it)."""
    root.mkdir(parents=True, exist_ok=True)
    models = {
        "text_encoder": text_encoder(vocab_size()),
        "unet": unet_model or unet(),
        "vae_decoder": vae_decoder(),
    }
    for name, model in models.items():
        (root / name).mkdir(exist_ok=True)
        onnx.save(model, root / name / "model.onnx")
    (root / "vae_decoder" / "config.json").write_text(json.dumps({"scaling_factor": 0.18215}))
    (root / "tokenizer").mkdir(exist_ok=True)
    for name, text in tokenizer_files().items():
        (root / "tokenizer" / name).write_text(text, encoding="utf-8")
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER))
    return root
