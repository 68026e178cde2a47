"""What releasing a LoRA adapter costs a device, beside shipping the fine-tune as a whole model.

    .venv/bin/python bench/llm_adapter.py [--model smollm2-135m] [--weights int8] [--rank 8] [--runs 3]

Reads the unpacked base package FERRY_BENCH_DIR/llm/<model>/ferry-<weights> and its checkpoint's
config (hf/config.json), both built by bench/llm.py.  Writes a random PEFT adapter of ``--rank`` on
every projection Ferry adapts (q/k/v/o, gate/up/down), converts it with ``convert_lora``, and prints:
the bytes a device downloads for the adapter against the base (what a merged fine-tune ships), the
time to load the adapter into a loaded base against loading the base, and greedy decode speed with
the adapter applied against the base alone (same process, runs interleaved, best of ``--runs``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import device_blas  # noqa: E402  (first: it may re-execute this command)

device_blas.unset_overrides()  # as bench/engine.py: the CPU's own OpenBLAS kernel set

# the repository first: bench/engine.py must not stand in for the engine package
sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from converter.llm.lora import convert_lora  # noqa: E402
from engine.llm.generate import generate  # noqa: E402
from engine.llm.lora import load_adapter  # noqa: E402
from engine.llm.package import load_model  # noqa: E402
from engine.llm.sampler import SamplingOptions  # noqa: E402
from engine.llm.tokenizer import LlmTokenizer  # noqa: E402

MODULES = {
    "self_attn.q_proj": ("q", "h"),
    "self_attn.k_proj": ("kv", "h"),
    "self_attn.v_proj": ("kv", "h"),
    "self_attn.o_proj": ("h", "q"),
    "mlp.gate_proj": ("i", "h"),
    "mlp.up_proj": ("i", "h"),
    "mlp.down_proj": ("h", "i"),
}


def write_peft(directory: Path, config: dict, rank: int, seed: int = 0) -> None:
    """A PEFT LoRA adapter directory with random weights of the checkpoint's shapes."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dims = {
        "h": config["hidden_size"],
        "i": config["intermediate_size"],
        "q": config["num_attention_heads"] * head,
        "kv": config.get("num_key_value_heads", config["num_attention_heads"]) * head,
    }
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (rows, cols) in MODULES.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            a = rng.standard_normal((rank, dims[cols]), dtype=np.float32) / np.sqrt(dims[cols])
            tensors[f"{key}.lora_A.weight"] = a
            tensors[f"{key}.lora_B.weight"] = 0.01 * rng.standard_normal((dims[rows], rank), dtype=np.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    targets = sorted({m.split(".")[1] for m in MODULES})
    peft = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets, "bias": "none"}
    (directory / "adapter_config.json").write_text(json.dumps(peft))


def package_bytes(directory: Path) -> int:
    """The bytes of an unpacked package's files (what its archive carries, give or take headers)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    return sum(int(f["size"]) for f in manifest["files"]) + len((directory / "manifest.json").read_bytes())


def decode_rate(model, tokenizer, prompt: list[int], tokens: int, adapter) -> float:
    result = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=tokens,
        options=SamplingOptions.from_dict({"temperature": 0}),
        stop_tokens=[],
        adapter=adapter,
    )
    return max(len(result.tokens) - 1, 1) / result.decode_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--weights", default="int8")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()
    root = Path(os.environ.get("FERRY_BENCH_DIR", "var/bench")) / "llm" / args.model
    base_dir = root / f"ferry-{args.weights}"
    config = json.loads((root / "hf" / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="ferry-adapter-bench-") as tmp:
        work = Path(tmp)
        write_peft(work / "peft", config, args.rank)
        started = time.perf_counter()
        report = convert_lora(work / "peft", base_dir, work / "adapter.ferry")
        convert_seconds = time.perf_counter() - started
        with tarfile.open(work / "adapter.ferry") as tar:
            tar.extractall(work / "adapter", filter="data")
        started = time.perf_counter()
        model = load_model(base_dir)
        tokenizer = LlmTokenizer.from_directory(base_dir)
        base_seconds = time.perf_counter() - started
        started = time.perf_counter()
        adapter = load_adapter(work / "adapter", model.config, "bench", report.base_digest)
        adapter_seconds = time.perf_counter() - started
        prompt = [
            int(t) for t in np.random.default_rng(1).integers(1, model.config.vocab_size, args.prompt_tokens)
        ]
        rates: dict[str, list[float]] = {"base": [], "adapter": []}
        decode_rate(model, tokenizer, prompt, 4, adapter)  # warm the JIT kernels once
        for _ in range(args.runs):
            rates["base"].append(decode_rate(model, tokenizer, prompt, args.decode, None))
            rates["adapter"].append(decode_rate(model, tokenizer, prompt, args.decode, adapter))
        base_bytes = package_bytes(base_dir)
        adapter_file = (work / "adapter.ferry").stat().st_size
    best = {k: max(v) for k, v in rates.items()}
    print(f"model {args.model} {args.weights}, LoRA rank {args.rank} on {', '.join(report.targets)}")
    print(
        f"download: adapter package {adapter_file / 1e6:.2f} MB, base (a merged fine-tune ships this) "
        f"{base_bytes / 1e6:.2f} MB: ratio {adapter_file / base_bytes:.3f}"
    )
    print(
        f"convert-lora: {convert_seconds:.2f} s; "
        f"load: adapter {adapter_seconds:.3f} s, base {base_seconds:.3f} s"
    )
    print(
        f"decode tok/s (best of {args.runs}, {args.prompt_tokens}-token prompt, {args.decode} tokens): "
        f"base {best['base']:.1f}, with adapter {best['adapter']:.1f}: "
        f"ratio {best['adapter'] / best['base']:.3f}"
    )


if __name__ == "__main__":
    main()
