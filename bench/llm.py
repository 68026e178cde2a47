"""Ferry's LLM runtime beside llama.cpp (through llama-cpp-python), same model, same bits, one run:
prefill and decode tok/s, peak RSS, file size, and the memory-bandwidth ceiling for decode.

    bench/setup_llama_cpp.sh          # once: builds the peer outside the repository (~20 min)
    .venv/bin/python bench/llm.py [--models smollm2-135m,qwen2.5-0.5b] [--weights int8,int4]
                                  [--threads 1,2] [--prefill 256] [--decode 64]

Per model (random weights with SmolLM2-135M's or Qwen2.5-0.5B's shapes, built with transformers
and saved as a Hugging Face checkpoint with a byte-level BPE tokenizer trained on this
repository's text; all under var/bench/llm/, built once):
- Ferry: ``convert_llm`` at int8 and int4 (block 32), the package unpacked;
- llama.cpp: the sdist's ``convert_hf_to_gguf.py`` (a patched copy: a freshly trained byte-level
  BPE tokenizer is llama.cpp's "gpt-2" pre-tokenizer, which its hash table cannot know) to an
  f32 GGUF, then ``llama_model_quantize`` to q8_0 and q4_0 with ``pure`` (every matrix at the
  type, embedding/output included, as Ferry stores them);
- both tokenize the same prompt; the table says whether the ids are identical.
Each (runtime, weights, threads) runs in a fresh process: map the model, prefill ``--prefill``
tokens, decode ``--decode`` tokens greedily (argmax of the logits each step, both runtimes);
its peak RSS is the process's VmHWM.  The ceiling is the bytes of weights a decode step reads
divided by the read bandwidth measured in this run at that thread count.  Ferry's rows also
split a decode step into its GEMVs per matrix and the rest (attention, norms, RoPE, Python).
``--aot`` adds rows ``ferry-aot``, interleaved with the others: the same package served with
the kernels compiled ahead of time (engine/llm/aot.py, ``FERRY_LLM_AOT=1``; built once before
the runs, in a subprocess), so the process never imports numba or LLVM.
The host is shared: compare ratios within one run.  Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import device_blas  # noqa: E402  (first: it may re-execute this command)

device_blas.unset_overrides()  # as bench/engine.py: the CPU's own OpenBLAS kernel set

import numpy as np  # noqa: E402  (after the re-exec above)
from llm_peer import PEER_DIR, PEER_TYPES, gguf_decode_bytes, gguf_files, peer_python  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

SHAPES = {
    "smollm2-135m": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


# ---------------------------------------------------------------- the model, built once
def train_tokenizer(directory: Path, vocab: int) -> None:
    """A byte-level BPE (GPT-2's pre-tokenizer) trained on this repository's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "*.md", "*.py"], capture_output=True, text=True, check=True
    ).stdout.split()
    texts = [(ROOT / f).read_text(encoding="utf-8", errors="replace") for f in files if (ROOT / f).is_file()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "add_prefix_space": False,
        "chat_template": TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def build_checkpoint(directory: Path, shape: dict) -> Path:
    """A random-weight Hugging Face checkpoint (float32 safetensors) and transformers' own logits
    for the first tokens of the prompt (``reference.npz``), for the fp32 parity line."""
    if (directory / "reference.npz").is_file():
        return directory
    import torch  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    fields = dict(shape)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(directory, safe_serialization=True)
    train_tokenizer(directory, shape["vocab_size"])
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "bos_token_id": 0}))
    ids = prompt_ids(directory, 32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    np.savez(directory / "reference.npz", ids=np.asarray(ids), logits=logits)
    return directory


def prompt_text(directory: Path, tokens: int) -> tuple[str, list[int]]:
    """README text cut to ``tokens`` tokens of the model's tokenizer (decoded, re-encoded)."""
    from engine.llm.tokenizer import LlmTokenizer  # noqa: PLC0415

    tokenizer = LlmTokenizer.from_directory(directory)
    ids = tokenizer.encode((ROOT / "README.md").read_text(encoding="utf-8"))[:tokens]
    text = tokenizer.decode(ids)
    return text, tokenizer.encode(text)


def prompt_ids(directory: Path, tokens: int) -> list[int]:
    return prompt_text(directory, tokens)[1]


def transformers_parity(checkpoint: Path) -> float:
    """max |Ferry fp32 logits - transformers' logits| over the reference prompt (every position)."""
    from engine.llm.checkpoint import load_checkpoint  # noqa: PLC0415
    from engine.llm.model import LlmModel, weights_from_checkpoint  # noqa: PLC0415

    reference = np.load(checkpoint / "reference.npz")
    loaded = load_checkpoint(checkpoint)
    model = LlmModel(loaded.config, weights_from_checkpoint(loaded, "fp32"))
    ids = reference["ids"].tolist()
    logits = model.forward(ids, model.new_cache(len(ids)), all_logits=True)
    return float(np.abs(logits - reference["logits"]).max())


def before_package(
    tree: Path | None, checkpoint: Path, directory: Path, precision: str, block: int
) -> Path | None:
    """The package an earlier tree's converter writes (``--before-tree``: a checkout of an earlier
    commit), converted once in a child running that tree's code; None without a tree."""
    if tree is None:
        return None
    target = directory / f"before-{precision}"
    if not (target / "accuracy.json").is_file():
        command = [sys.executable, __file__, "--convert", str(tree), str(checkpoint), str(directory)]
        subprocess.run(command + [precision, str(block)], check=True)
    return target


def ferry_package(checkpoint: Path, directory: Path, precision: str, block: int) -> tuple[Path, dict]:
    """``convert_llm`` into an archive, unpacked; (the package directory, its accuracy report)."""
    import tarfile  # noqa: PLC0415

    from converter.llm.convert import convert_llm  # noqa: PLC0415

    unpacked = directory / f"ferry-{precision}"
    if not (unpacked / "accuracy.json").is_file():
        archive = directory / f"ferry-{precision}.ferry"
        convert_llm(checkpoint, archive, weights=precision, block=block)
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        archive.unlink()
    return unpacked, json.loads((unpacked / "accuracy.json").read_text())


# ---------------------------------------------------------------- the timed children
def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def ferry_child(package: Path, threads: int, prompt: dict, decode: int) -> dict:
    """Map, prefill, decode; tok/s, peak RSS and one decode step's GEMVs by matrix."""
    from engine import jit  # noqa: PLC0415
    from engine.llm import aot  # noqa: PLC0415
    from engine.llm.package import load_model  # noqa: PLC0415
    from engine.llm.threads import prepare, running_on  # noqa: PLC0415
    from engine.llm.weights import gemv_kernel  # noqa: PLC0415

    if threads > 1:
        prepare(threads)  # as serve-llm --threads activates: parallel kernels compiled or loaded
    with running_on(threads):  # as the chat API runs a request (serve-llm --threads)
        model = load_model(package)
        for op in ("LlmGemvInt4", "LlmGemvInt8"):
            gemv_kernel(op)  # compile or load the JIT kernels before timing
        ids = prompt["ids"]
        context = len(ids) + decode + 1
        model.forward(ids[:8], model.new_cache(context))  # warm-up (first touch of the pages)
        cache = model.new_cache(context)
        start, cpu = time.perf_counter(), time.process_time()
        logits = model.forward(ids, cache)
        prefill_s, prefill_cpu = time.perf_counter() - start, time.process_time() - cpu
        token = int(np.argmax(logits))
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(decode):
            token = int(np.argmax(model.forward([token], cache)))
        decode_s, decode_cpu = time.perf_counter() - start, time.process_time() - cpu
        gemv = _gemv_seconds(model)
    return {
        "prefill_tps": len(ids) / prefill_s,
        "decode_tps": decode / decode_s,
        "decode_ms": decode_s / decode * 1e3,
        **_cpu_rates(len(ids), prefill_cpu, decode, decode_cpu),
        "gemv_ms": {k: v * 1e3 for k, v in gemv.items()},
        "rss_mb": _peak_rss_mb(),
        "tier": "aot" if aot.kernels() is not None else "jit" if jit.enabled() else "numpy",
        "numba_imported": "numba" in sys.modules,
    }


def _cpu_rates(prompt: int, prefill_cpu: float, decode: int, decode_cpu: float) -> dict:
    """Tokens per CPU second (every thread's CPU time): on a shared host a runtime's own work,
    which wall time mixes with other jobs' (at 2 threads it also counts spinning threads)."""
    return {
        "prefill_cpu_tps": prompt / max(prefill_cpu, 1e-9),
        "decode_cpu_tps": decode / max(decode_cpu, 1e-9),
    }


def _gemv_seconds(model: object) -> dict[str, float]:
    """One token's GEMVs alone, by matrix (every layer's, and the LM head), best of five."""
    weights = model.weights  # type: ignore[attr-defined]
    groups = {
        name: [getattr(layer, name) for layer in weights.layers] for name in ("qkv", "o", "gate_up", "down")
    }
    groups["lm_head"] = [weights.lm_head]
    found = {}
    for name, matrices in groups.items():
        x = np.ones(matrices[0].shape[1], np.float32)
        best = float("inf")
        for _ in range(5):  # CPU time: one thread's own work, whatever else the host runs
            start = time.process_time()
            for matrix in matrices:
                matrix.gemv(x)
            best = min(best, time.process_time() - start)
        found[name] = best
    return found


def llama_child(gguf: Path, threads: int, prompt: dict, decode: int) -> dict:
    """Runs in the peer's venv: the same steps through llama-cpp-python."""
    from llama_cpp import Llama  # noqa: PLC0415

    context = len(prompt["ids"]) + decode + 16
    llm = Llama(
        model_path=str(gguf),
        n_ctx=context,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    ids = llm.tokenize(prompt["text"].encode(), add_bos=False, special=False)
    vocab = llm.n_vocab()

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

    llm.eval(ids[:8])  # warm-up, as Ferry's
    llm.reset()
    start, cpu = time.perf_counter(), time.process_time()
    llm.eval(ids)
    prefill_s, prefill_cpu = time.perf_counter() - start, time.process_time() - cpu
    token = int(np.argmax(last_logits()))
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(decode):
        llm.eval([token])
        token = int(np.argmax(last_logits()))
    decode_s, decode_cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "prefill_tps": len(ids) / prefill_s,
        "decode_tps": decode / decode_s,
        "decode_ms": decode_s / decode * 1e3,
        **_cpu_rates(len(ids), prefill_cpu, decode, decode_cpu),
        "rss_mb": _peak_rss_mb(),
        "tokens_match": ids == prompt["ids"],
    }


# ---------------------------------------------------------------- bandwidth
def bandwidth(threads: int, megabytes: int = 256) -> float:
    """Read bandwidth in GB/s: the best of a few sums over a buffer far larger than the caches."""
    data = np.ones(megabytes << 18, np.float32)
    from engine import jit  # noqa: PLC0415

    if jit.enabled() and threads > 1:
        return _numba_bandwidth(data, threads)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best / 1e9


def _numba_bandwidth(data: np.ndarray, threads: int) -> float:
    import numba  # noqa: PLC0415

    @numba.njit(parallel=True, fastmath=True)
    def total(a: np.ndarray) -> float:
        s = 0.0
        for i in numba.prange(a.size):
            s += a[i]
        return s

    numba.set_num_threads(threads)
    total(data)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        total(data)
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best / 1e9


def decode_bytes(package: Path) -> int:
    """Bytes a Ferry decode step reads: every matrix once (tied: the embedding is the head)."""
    index = json.loads((package / "llm.json").read_text())
    return sum(
        int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
        for name, t in index["tensors"].items()
        if name.split(".")[-1] in ("w", "q", "scale")
    )


# ---------------------------------------------------------------- the run
def run_model(name: str, args: argparse.Namespace, ceilings: dict[int, float]) -> list[tuple]:
    directory = Path(os.environ.get("FERRY_BENCH_DIR", ROOT / "var" / "bench")) / "llm" / name
    checkpoint = build_checkpoint(directory / "hf", SHAPES[name])
    precisions = args.weights.split(",")
    text, ids = prompt_text(checkpoint, args.prefill)
    prompt_file = directory / "prompt.json"
    prompt_file.write_text(json.dumps({"text": text, "ids": ids}))
    packages = {p: ferry_package(checkpoint, directory, p, args.block) for p in precisions}
    peer = peer_python()
    ggufs = gguf_files(checkpoint, directory, precisions) if peer and not args.no_peer else {}
    parity = transformers_parity(checkpoint)
    print(f"\n{name}: random weights; fp32 logits vs transformers' forward: max |diff| {parity:.2e}")
    for precision, (_, accuracy) in packages.items():
        print(
            f"  ferry {precision} accuracy vs fp32 over {accuracy['tokens']} tokens: top-1 "
            f"{accuracy['top1_agreement']:.1%}, mean KL {accuracy['mean_kl']:.2e}, "
            f"perplexity {accuracy['perplexity']:.1f} (fp32 {accuracy['fp32_perplexity']:.1f})"
        )
    if args.aot:  # built before any timing (package activation's job in the agent)
        __import__("engine.llm.aot").llm.aot.build()
    os.environ["FERRY_LLM_AOT"] = "0"  # rows ferry-jit on numba; ferry-aot rows set it to 1
    before = {p: before_package(args.before_tree, checkpoint, directory, p, args.block) for p in precisions}
    rows = []
    for precision in precisions:
        package = packages[precision][0]
        for t in args.threads:
            runs: dict[str, list[dict]] = {"ferry": [], "aot": [], "llama": [], "before": []}
            for _ in range(args.repeat):  # alternating, so both see the same spells of load
                command = [
                    sys.executable,
                    __file__,
                    "--child",
                    "ferry",
                    str(package),
                    str(t),
                    str(prompt_file),
                ]
                runs["ferry"].append(_run(command + ["--decode", str(args.decode)]))
                if args.aot:
                    aot_env = dict(os.environ, FERRY_LLM_AOT="1")
                    runs["aot"].append(_run(command + ["--decode", str(args.decode)], aot_env))
                if before[precision] is not None:
                    command[4] = str(before[precision])
                    extra = ["--decode", str(args.decode), "--root", str(args.before_tree)]
                    runs["before"].append(_run(command + extra))
                if precision in ggufs:
                    command = [str(peer), __file__, "--child", "llama", str(ggufs[precision]), str(t)]
                    runs["llama"].append(_run(command + [str(prompt_file), "--decode", str(args.decode)]))
            result = _best(runs["ferry"])
            size = sum(p.stat().st_size for p in package.iterdir()) / 1e6
            ceiling = ceilings[t] * 1e9 / decode_bytes(package)
            rows.append((f"ferry-{result['tier']}", precision, t, result, size, ceiling))
            if runs["aot"]:
                aot_row = _best(runs["aot"])
                rows.append((f"ferry-{aot_row['tier']}", precision, t, aot_row, size, ceiling))
            if runs["before"]:
                old_package = before[precision]
                old_size = sum(p.stat().st_size for p in old_package.iterdir()) / 1e6
                old_ceiling = ceilings[t] * 1e9 / decode_bytes(old_package)
                rows.append(("ferry-old", precision, t, _best(runs["before"]), old_size, old_ceiling))
            if runs["llama"]:
                gguf = ggufs[precision]
                ceiling = ceilings[t] * 1e9 / gguf_decode_bytes(gguf)
                peer_row = (_best(runs["llama"]), gguf.stat().st_size / 1e6, ceiling)
                rows.append(("llama.cpp", PEER_TYPES[precision][0], t, *peer_row))
    return rows


def _best(results: list[dict]) -> dict:
    """The fastest of repeated runs, field by field (a shared host only ever slows a run down)."""
    best = dict(results[0])
    for key in ("prefill_tps", "decode_tps", "prefill_cpu_tps", "decode_cpu_tps"):
        best[key] = max(r.get(key, float("nan")) for r in results)
    best["decode_ms"] = min(r["decode_ms"] for r in results)
    if "gemv_ms" in best:
        best["gemv_ms"] = {k: min(r["gemv_ms"][k] for r in results) for k in best["gemv_ms"]}
    best["rss_mb"] = max(r["rss_mb"] for r in results)
    return best


def _run(command: list[str], env: dict | None = None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(name: str, args: argparse.Namespace, rows: list[tuple]) -> None:
    print(
        f"{name}: prefill {args.prefill} tokens, decode {args.decode} tokens greedily, best of {args.repeat}"
    )
    header = f"{'runtime':<11}{'weights':<8}{'threads':>8}{'prefill tok/s':>14}{'decode tok/s':>13}"
    header += f"{'ceiling tok/s':>14}{'peak RSS MB':>12}{'file MB':>9}"
    header += f"{'prefill/cpu-s':>14}{'decode/cpu-s':>13}  same ids"
    print(header)
    for runtime, weights, t, r, size, ceiling in rows:
        same = "" if "tokens_match" not in r else ("yes" if r["tokens_match"] else "NO")
        print(
            f"{runtime:<11}{weights:<8}{t:>8}{r['prefill_tps']:>14.1f}{r['decode_tps']:>13.1f}"
            f"{ceiling:>14.1f}{r['rss_mb']:>12.0f}{size:>9.1f}{r.get('prefill_cpu_tps', float('nan')):>14.1f}"
            f"{r.get('decode_cpu_tps', float('nan')):>13.1f}  {same}"
        )
    print("Ferry's decode step, CPU ms per token: GEMVs by matrix (alone, best of 5) and the rest")
    print(
        f"{'runtime':<11}{'weights':<8}{'threads':>8}{'qkv':>7}{'o':>7}{'gate_up':>8}{'down':>7}"
        f"{'lm_head':>8}{'rest':>7}{'step':>7}"
    )
    for runtime, weights, t, r, _, _ in rows:
        if runtime.startswith("ferry"):
            g = r["gemv_ms"]
            step = 1e3 / r["decode_cpu_tps"] if "decode_cpu_tps" in r else r["decode_ms"]
            rest = step - sum(g.values())
            print(
                f"{runtime:<11}{weights:<8}{t:>8}{g['qkv']:>7.2f}{g['o']:>7.2f}{g['gate_up']:>8.2f}{g['down']:>7.2f}"
                f"{g['lm_head']:>8.2f}{rest:>7.2f}{step:>7.2f}"
            )


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runtime", choices=("ferry", "llama"))
    parser.add_argument("model", type=Path)
    parser.add_argument("threads", type=int)
    parser.add_argument("prompt", type=Path)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--root", type=Path, help="run this tree's engine (--before-tree)")
    args = parser.parse_args(argv)
    if args.root is not None:
        sys.path[:0] = [str(args.root)]
    prompt = json.loads(args.prompt.read_text())
    run = ferry_child if args.runtime == "ferry" else llama_child
    print(json.dumps(run(args.model, args.threads, prompt, args.decode)))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["--convert"]:  # tree checkpoint directory precision block
        tree, checkpoint, directory, precision, block = sys.argv[2:7]
        sys.path[:0] = [tree]
        scratch = Path(directory) / "before-build"  # not the current tree's ferry-<precision>
        scratch.mkdir(exist_ok=True)
        ferry_package(Path(checkpoint), scratch, precision, int(block))[0].rename(
            Path(directory) / f"before-{precision}"
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--weights", default="int8,int4")
    parser.add_argument("--threads", default="1,2", type=lambda s: [int(t) for t in s.split(",")])
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1, help="runs per row, alternating; the best is kept")
    parser.add_argument("--no-peer", action="store_true", help="Ferry alone (no llama.cpp rows)")
    parser.add_argument("--aot", action="store_true", help="also Ferry on AOT kernels (rows ferry-aot)")
    parser.add_argument(
        "--before-tree", type=Path, help="also run an earlier checkout's Ferry, interleaved (rows ferry-old)"
    )
    args = parser.parse_args()
    if peer_python() is None and not args.no_peer:
        print(f"llama.cpp peer not built in {PEER_DIR}: run bench/setup_llama_cpp.sh (Ferry rows only)")
    ceilings = {t: bandwidth(t) for t in args.threads}
    print("read bandwidth: " + ", ".join(f"{t} thread(s) {gbs:.1f} GB/s" for t, gbs in ceilings.items()))
    tables = [(name, run_model(name, args, ceilings)) for name in args.models.split(",")]
    for name, rows in tables:
        print()
        print_table(name, args, rows)


if __name__ == "__main__":
    main()
