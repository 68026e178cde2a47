"""The five benchmark models, built with torch (random weights) and exported to ONNX once.

Each function builds its model in plain ``torch.nn`` (no torchvision), calibrates the
BatchNorm statistics on random inputs so activations keep a sane scale, exports it with
the TorchScript exporter (``dynamo=False``, opset 17, batch 1, fp32) to
``var/bench/<name>.onnx`` and returns that path.  An existing file is reused, so the
export (and torch itself) costs only the first time; nothing is ever downloaded.

torch is imported here only: the engine, converter and tests never depend on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FERRY_BENCH_DIR", ROOT / "var" / "bench"))
OPSET = 17
SEED = 0


def _torch():
    import torch  # noqa: PLC0415 - torch is heavy and optional: import it only when building

    return torch


# -- building blocks ---------------------------------------------------------------------------


def _conv_bn(nn, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: str | None = "relu"):
    layers = [
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, momentum=None),  # momentum=None: running stats = plain average
    ]
    if act == "relu":
        layers.append(nn.ReLU(inplace=True))
    elif act == "relu6":
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


def _mobilenet_v2():
    torch = _torch()
    nn = torch.nn

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = cin * expand
            layers = [] if expand == 1 else [_conv_bn(nn, cin, hidden, 1, act="relu6")]
            layers += [
                _conv_bn(nn, hidden, hidden, 3, stride, groups=hidden, act="relu6"),
                _conv_bn(nn, hidden, cout, 1, act=None),
            ]
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.residual else self.block(x)

    # (expansion, channels, repeats, first stride): MobileNetV2 1.0, Sandler et al. 2018, table 2.
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2)]
    settings.append((6, 320, 1, 1))
    layers, cin = [_conv_bn(nn, 3, 32, 3, 2, act="relu6")], 32
    for expand, cout, repeats, stride in settings:
        for i in range(repeats):
            layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
            cin = cout
    layers.append(_conv_bn(nn, cin, 1280, 1, act="relu6"))

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, 1000)

        def forward(self, x):
            return self.classifier(self.features(x).mean((2, 3)))

    return MobileNetV2(), {"input": (1, 3, 224, 224)}


def _resnet18():
    torch = _torch()
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                _conv_bn(nn, cin, cout, 3, stride), _conv_bn(nn, cout, cout, 3, act=None)
            )
            self.down = None if stride == 1 and cin == cout else _conv_bn(nn, cin, cout, 1, stride, act=None)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(_conv_bn(nn, 3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
                blocks += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))

    return ResNet18(), {"input": (1, 3, 224, 224)}


def _attention(nn, dim: int, heads: int):
    torch = _torch()

    class Attention(nn.Module):
        """Multi-head self-attention written out (nn.MultiheadAttention exports less plainly)."""

        def __init__(self) -> None:
            super().__init__()
            self.heads, self.head_dim = heads, dim // heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x, past_k=None, past_v=None):
            b, t, _ = x.shape
            qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            if past_k is not None:
                k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            scores = (q @ k.transpose(-2, -1)) * (self.head_dim**-0.5)
            out = scores.softmax(-1) @ v
            out = self.proj(out.transpose(1, 2).reshape(b, t, -1))
            return (out, k, v) if past_k is not None else out

    return Attention()


def _mlp(nn, dim: int, hidden: int):
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


def _vit_tiny():
    torch = _torch()
    nn = torch.nn
    dim, depth, heads, patch, size = 192, 12, 3, 16, 224

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(dim), _attention(nn, dim, heads)
            self.ln2, self.mlp = nn.LayerNorm(dim), _mlp(nn, dim, 4 * dim)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, dim, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
            self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
            self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, 1000)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.ln(self.blocks(x))[:, 0])

    return ViT(), {"input": (1, 3, size, size)}


def _bert_encoder():
    torch = _torch()
    nn = torch.nn
    dim, depth, heads, ffn, vocab, seq = 384, 6, 12, 1536, 30522, 128

    class Layer(nn.Module):
        """Post-LN, as in BERT."""

        def __init__(self) -> None:
            super().__init__()
            self.attn, self.ln1 = _attention(nn, dim, heads), nn.LayerNorm(dim, eps=1e-12)
            self.mlp, self.ln2 = _mlp(nn, dim, ffn), nn.LayerNorm(dim, eps=1e-12)

        def forward(self, x):
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.mlp(x))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(512, dim)
            self.ln = nn.LayerNorm(dim, eps=1e-12)
            self.layers = nn.Sequential(*[Layer() for _ in range(depth)])

        def forward(self, input_ids):
            positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
            return self.layers(self.ln(self.tokens(input_ids) + self.positions(positions)))

    return Encoder(), {"input_ids": ((1, seq), vocab)}


def _gpt_decoder_step():
    torch = _torch()
    nn = torch.nn
    dim, depth, heads, vocab, past = 512, 6, 8, 16384, 127

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(dim), _attention(nn, dim, heads)
            self.ln2, self.mlp = nn.LayerNorm(dim), _mlp(nn, dim, 4 * dim)

        def forward(self, x, past_k, past_v):
            out, k, v = self.attn(self.ln1(x), past_k, past_v)
            x = x + out
            return x + self.mlp(self.ln2(x)), k, v

    class Decoder(nn.Module):
        """One decode step: a token, its position and every layer's KV cache in; logits and new cache out."""

        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(1024, dim)
            self.blocks = nn.ModuleList([Block() for _ in range(depth)])
            self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

        def forward(self, input_ids, past_keys, past_values):
            position = torch.full_like(input_ids, past_keys.shape[3])
            x = self.tokens(input_ids) + self.positions(position)
            keys, values = [], []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, past_keys[i], past_values[i])
                keys.append(k)
                values.append(v)
            return self.head(self.ln(x)), torch.stack(keys), torch.stack(values)

    cache = (depth, 1, heads, past, dim // heads)
    inputs = {"input_ids": ((1, 1), vocab), "past_keys": cache, "past_values": cache}
    return Decoder(), inputs, ["logits", "present_keys", "present_values"]


# -- export ------------------------------------------------------------------------------------


def _example(spec, generator):
    """An input from its spec: a shape (float, N(0,1)) or (shape, vocab) for token ids."""
    torch = _torch()
    if isinstance(spec[0], tuple):
        shape, vocab = spec
        return torch.randint(0, vocab, shape, generator=generator)
    return torch.randn(spec, generator=generator)


def _calibrate(model, inputs: dict, generator) -> None:
    """Set every BatchNorm's running statistics to those of a random batch (momentum=None: a
    cumulative average), so each normalised activation has roughly zero mean and unit variance."""
    torch = _torch()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
    model.train()
    batch = {name: torch.cat([_example(spec, generator) for _ in range(4)]) for name, spec in inputs.items()}
    with torch.no_grad():
        model(*batch.values())


def _export(name: str, build: Callable) -> Path:
    path = CACHE / f"{name}.onnx"
    if path.exists():
        return path
    torch = _torch()
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    built = build()
    model, inputs = built[0], built[1]
    outputs = built[2] if len(built) > 2 else ["output"]
    _calibrate(model, inputs, generator)
    model.eval()
    example = tuple(_example(spec, generator) for spec in inputs.values())
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with torch.no_grad():
        torch.onnx.export(
            model,
            example,
            str(tmp),
            dynamo=False,
            opset_version=OPSET,
            input_names=list(inputs),
            output_names=outputs,
            do_constant_folding=True,
        )
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    return path


def mobilenet_v2() -> Path:
    """MobileNetV2 1.0, 224x224 RGB in, 1000 logits out."""
    return _export("mobilenet_v2", _mobilenet_v2)


def resnet18() -> Path:
    """ResNet18, 224x224 RGB in, 1000 logits out."""
    return _export("resnet18", _resnet18)


def vit_tiny() -> Path:
    """ViT-Tiny (patch 16, dim 192, depth 12, 3 heads), 224x224 RGB in, 1000 logits out."""
    return _export("vit_tiny", _vit_tiny)


def bert_encoder() -> Path:
    """A 6-layer BERT-style encoder (hidden 384, 12 heads, FFN 1536), 128 token ids in."""
    return _export("bert_encoder", _bert_encoder)


def gpt_decoder_step() -> Path:
    """A GPT-style decode step (6 layers, d 512, 8 heads, vocab 16384): one token, a 127-token KV cache."""
    return _export("gpt_decoder_step", _gpt_decoder_step)


ALL: dict[str, Callable[[], Path]] = {
    "mobilenet_v2": mobilenet_v2,
    "resnet18": resnet18,
    "vit_tiny": vit_tiny,
    "bert_encoder": bert_encoder,
    "gpt_decoder_step": gpt_decoder_step,
}


if __name__ == "__main__":
    for name, fn in ALL.items():
        print(name, fn())
