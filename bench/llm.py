"""Ferry's LLM runtime: prefill and decode tok/s, peak RSS and file size, beside the machine's
memory-bandwidth ceiling for decode, for a random-weight model with SmolLM2-135M's shapes.

    .venv/bin/python bench/llm.py [--weights fp32,int8,int4] [--threads 1,2] [--decode 64]

The model (Llama architecture: hidden 576, 30 layers, 9 heads / 3 kv heads, MLP 1536, vocab
49152, tied embedding) is built with numpy (no download, no torch), stored at each precision as
a Ferry LLM package directory under var/bench/llm/, and each (weights, threads) pair runs in a
fresh process that maps the package, prefills ``--prefill`` tokens, then decodes greedily; its
peak RSS (VmHWM) is the process's.  The ceiling is bytes read per decoded token (every matrix
once: layers and the LM head) divided by the read bandwidth measured in this run with the same
thread count.  llama.cpp beside it (issue 21's peer, through llama-cpp-python) is not built
here yet: its build takes both cores for ~20 minutes.  Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# As bench/engine.py: measure with the CPU's own OpenBLAS kernel set, as a device would.
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
if any(name in os.environ for name in OPENBLAS_OVERRIDES) and "--child" not in sys.argv:
    _env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_OVERRIDES}
    os.execve(sys.executable, [sys.executable, *sys.argv], _env)

import numpy as np  # noqa: E402  (after the re-exec above)

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

SMOLLM2_135M = {
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
    "hidden_act": "silu",
}


def random_checkpoint(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 tensors with the config's names and shapes (N(0, 1/fan_in) matrices)."""
    from engine.llm.checkpoint import expected_shapes  # noqa: PLC0415
    from engine.llm.config import parse_config  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(parse_config(config)).items():
        if len(shape) == 1:
            tensors[name] = np.ones(shape, np.float32)
        else:
            scale = 1.0 if "embed" in name else 1.0 / np.sqrt(shape[1])
            tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
    return tensors


def build_packages(directory: Path, precisions: list[str], block: int) -> dict[str, Path]:
    """One package directory per precision (llm.json + weights.bin), built once."""
    from engine.llm.checkpoint import Checkpoint  # noqa: PLC0415
    from engine.llm.config import parse_config  # noqa: PLC0415
    from engine.llm.model import weights_from_checkpoint  # noqa: PLC0415
    from engine.llm.package import INDEX, WEIGHTS, serialize  # noqa: PLC0415

    found = {p: directory / f"smollm2-135m-{p}" for p in precisions}
    missing = [p for p, path in found.items() if not (path / WEIGHTS).is_file()]
    if missing:
        config = parse_config(SMOLLM2_135M)
        checkpoint = Checkpoint(directory, config, random_checkpoint(SMOLLM2_135M))
        for precision in missing:
            weights = weights_from_checkpoint(checkpoint, precision, block)
            index, data = serialize(config, weights, precision, block)
            path = found[precision]
            path.mkdir(parents=True, exist_ok=True)
            (path / WEIGHTS).write_bytes(data)
            (path / INDEX).write_bytes(index)
    return found


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(package: Path, threads: int, prefill: int, decode: int) -> dict:
    """Runs in a fresh process: map, prefill, decode; tok/s and peak RSS."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    from engine import jit  # noqa: PLC0415
    from engine.llm.package import load_model  # noqa: PLC0415
    from engine.llm.weights import gemv_kernel  # noqa: PLC0415

    with threadpool_limits(threads), jit.thread_limit(threads):
        start = time.perf_counter()
        model = load_model(package)
        for op in ("LlmGemvInt4", "LlmGemvInt8"):
            gemv_kernel(op)  # compile or load the JIT kernels before timing
        load = time.perf_counter() - start
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, model.config.vocab_size, prefill).tolist()
        context = prefill + decode + 1
        model.forward(prompt[:8], model.new_cache(context))  # warm-up (first touch of the pages)
        cache = model.new_cache(context)
        start = time.perf_counter()
        logits = model.forward(prompt, cache)
        prefill_s = time.perf_counter() - start
        token = int(np.argmax(logits))
        start = time.perf_counter()
        for _ in range(decode):
            token = int(np.argmax(model.forward([token], cache)))
        decode_s = time.perf_counter() - start
        gemv_s = _gemv_seconds(model)
    return {
        "gemv_ms": gemv_s * 1e3,
        "other_ms": max(decode_s / decode - gemv_s, 0.0) * 1e3,
        "prefill_tps": prefill / prefill_s,
        "decode_tps": decode / decode_s,
        "rss_mb": _peak_rss_mb(),
        "load_s": load,
        "tier": "jit" if jit.enabled() else "numpy",
    }


def _gemv_seconds(model: object) -> float:
    """One token's GEMVs alone (every matrix once, the LM head included), best of three: the
    rest of a decode step's time is attention, norms, RoPE and Python."""
    weights = model.weights  # type: ignore[attr-defined]
    matrices = [m for layer in weights.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    matrices.append(weights.lm_head)
    inputs = [np.ones(m.shape[1], np.float32) for m in matrices]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for matrix, x in zip(matrices, inputs, strict=True):
            matrix.gemv(x)
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth(threads: int, megabytes: int = 256) -> float:
    """Read bandwidth in GB/s: the best of a few sums over a buffer far larger than the caches."""
    data = np.ones(megabytes << 18, np.float32)  # megabytes MB of float32
    try:
        from engine import jit  # noqa: PLC0415

        if jit.enabled() and threads > 1:
            return _numba_bandwidth(data, threads)
    except ImportError:
        pass
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
    """Bytes a decode step reads: every matrix once (the embedding row aside; tied -> the head)."""
    index = json.loads((package / "llm.json").read_text())
    return sum(
        int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
        for name, t in index["tensors"].items()
        if name.split(".")[-1] in ("w", "q", "scale")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="fp32,int8,int4")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--child", nargs=2, metavar=("PACKAGE", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), int(args.child[1]), args.prefill, args.decode)))
        return
    directory = Path(os.environ.get("FERRY_BENCH_DIR", ROOT / "var" / "bench")) / "llm"
    packages = build_packages(directory, args.weights.split(","), args.block)
    threads = [int(t) for t in args.threads.split(",")]
    ceilings = {t: bandwidth(t) for t in threads}
    rows = []
    for precision, package in packages.items():
        for t in threads:
            command = [sys.executable, __file__, "--child", str(package), str(t)]
            command += ["--prefill", str(args.prefill), "--decode", str(args.decode)]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            size = sum(p.stat().st_size for p in package.iterdir()) / 1e6
            ceiling = ceilings[t] * 1e9 / decode_bytes(package)
            rows.append((precision, t, result, size, ceiling))
    print(f"SmolLM2-135M shapes, random weights; prefill {args.prefill} tokens, decode {args.decode}")
    print("read bandwidth: " + ", ".join(f"{t} thread(s) {gbs:.1f} GB/s" for t, gbs in ceilings.items()))
    header = f"{'runtime':<12}{'weights':<9}{'threads':>8}{'prefill tok/s':>15}{'decode tok/s':>14}"
    header += f"{'ceiling tok/s':>15}{'peak RSS MB':>13}{'file MB':>9}{'GEMV ms/tok':>13}{'other ms/tok':>14}"
    print(header)
    for precision, t, r, size, ceiling in rows:
        runtime = f"ferry-{r['tier']}"
        print(
            f"{runtime:<12}{precision:<9}{t:>8}{r['prefill_tps']:>15.1f}{r['decode_tps']:>14.1f}"
            f"{ceiling:>15.1f}{r['rss_mb']:>13.0f}{size:>9.1f}{r['gemv_ms']:>13.1f}{r['other_ms']:>14.1f}"
        )
    print("llama.cpp (q8_0/q4_0 via llama-cpp-python): not built this session (see the module docstring)")


if __name__ == "__main__":
    main()
