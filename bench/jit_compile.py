"""What the JIT tier costs a Session: first-ever compile and warm-cache load, model by model.

    .venv/bin/python bench/jit_compile.py [--models mobilenet_v2,gpt_decoder_step-int8] [--breakdown]

For each benchmark package (bench/models.py's five in fp32, the transformers in int8 as well,
and the small diffusion UNet when bench/diffusion.py's layout exists) this creates a Session in
a fresh process twice: with an empty JIT cache directory (the first compile a device pays at
activation) and again on the cache that left (a restart).  It prints wall and CPU seconds of
Session creation and the JIT modules loaded; ``all`` is every JIT module (``jit.load()``, the
figure bench/engine.py prints).  ``--breakdown`` adds, per compiled function, its signatures
and seconds under numba's compiler lock, and numba's compiler passes summed: where a cold
compile goes.  ``--peer DIR`` measures another checkout's engine (``git archive <commit> engine |
tar -x -C DIR``) the same way, interleaved model by model, and prints Ferry-now / peer ratios:
the host's load moves both alike.  Packages are converted once into ``var/jit-bench/``.

It prints a table; it is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import models  # noqa: E402 - bench/models.py, found through the path set above

OUT = ROOT / "var" / "jit-bench"
QUANTIZED = ("vit_tiny", "bert_encoder", "gpt_decoder_step")


def packages() -> dict[str, Path]:
    """label -> package: converted once (a later run reuses the files)."""
    from converter import convert  # noqa: PLC0415

    OUT.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for name in models.ALL:
        for quantize in (None, "int8") if name in QUANTIZED else (None,):
            label = name + (f"-{quantize}" if quantize else "")
            package = OUT / f"{label}.ferry"
            if not package.is_file():
                convert(models.ALL[name](), package, quantize=quantize)
            found[label] = package
    unet = models.CACHE / "diffusion" / "small" / "unet" / "model.onnx"
    if unet.is_file():
        package = OUT / "unet-small.ferry"
        if not package.is_file():
            import diffusion  # noqa: PLC0415 - bench/diffusion.py: the UNet's feeds

            convert(
                unet,
                package,
                selftest_inputs=diffusion.unet_feeds(
                    unet.parent.parent, diffusion.UNETS["small"]["cross_attention_dim"]
                ),
            )
        found["unet-small"] = package
    return found


def child(package: str, cache: str, threads: int, breakdown: bool, engine_root: str | None) -> None:
    """In a fresh process: create the Session (or load every JIT module for ``all``), print figures."""
    if engine_root:
        sys.path.insert(0, engine_root)
    from engine import Session, jit  # noqa: PLC0415

    jit.set_cache_dir(cache)
    recorder = _install_recorder() if breakdown else None
    wall, cpu = time.perf_counter(), time.process_time()
    if package == "all":
        try:
            jit.load(threads=threads)
        except TypeError:  # a peer from before load() took threads: it compiles every variant
            jit.load()
    else:
        Session(package, threads=threads)
    figures = {
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "modules": [m.__name__.rsplit(".", 1)[-1] for m in jit.loaded()],
    }
    if recorder is not None:
        figures["breakdown"] = _functions(jit.loaded())
        figures["passes"] = recorder
    print(json.dumps(figures))


def _install_recorder() -> dict[str, float]:
    """CPU seconds (this thread's) per function numba compiles from here on, its own passes only:
    a function compiled inside another's pass (a callee, one of numba's overloads) counts apart."""
    from numba.core import event  # noqa: PLC0415

    totals: dict[str, float] = defaultdict(float)
    stack: list[list[float]] = []  # per running pass: [start, seconds of passes nested in it]

    class Passes(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            stack.append([time.thread_time(), 0.0])

        def on_end(self, ev: event.Event) -> None:
            start, nested = stack.pop()
            spent = time.thread_time() - start
            totals[ev.data["qualname"]] += spent - nested
            if stack:
                stack[-1][1] += spent

    event.register("numba:run_pass", Passes())
    return totals


def _functions(modules: list) -> list[tuple[str, int, float, float]]:
    """(module.function, signatures, compiler-lock s, LLVM-lock s) of every dispatcher loaded."""
    from numba.core.dispatcher import Dispatcher  # noqa: PLC0415

    rows = []
    for module in modules:
        for name, value in vars(module).items():
            if isinstance(value, Dispatcher) and value.__module__ == module.__name__:
                timers = [value.get_metadata(sig).get("timers", {}) for sig in value.signatures]
                rows.append(
                    (
                        f"{module.__name__.rsplit('.', 1)[-1]}.{name}",
                        len(value.signatures),
                        sum(t.get("compiler_lock", 0.0) for t in timers),
                        sum(t.get("llvm_lock", 0.0) for t in timers),
                    )
                )
    return sorted(rows, key=lambda row: -row[2])


def fresh(package: str, cache: str, threads: int, breakdown: bool = False, engine_root: str = "") -> dict:
    argv = [sys.executable, __file__, "--child", package, cache, str(threads)]
    argv += ["--breakdown"] if breakdown else []
    argv += ["--engine-root", engine_root] if engine_root else []
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold_and_warm(package: str, threads: int, breakdown: bool, engine_root: str = "") -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory(prefix="ferry-jit-cache-") as cache:
        cold = fresh(package, cache, threads, breakdown, engine_root)
        warm = fresh(package, cache, threads, engine_root=engine_root)
    return cold, warm


def measure(label: str, package: str, threads: int, breakdown: bool, peer: str) -> None:
    cold, warm = cold_and_warm(package, threads, breakdown)
    modules = ",".join(cold["modules"]) or "(no numba)"
    print(
        f"{label:<24} cold {cold['wall_s']:6.1f} s wall {cold['cpu_s']:6.1f} s CPU | "
        f"warm {warm['wall_s']:5.2f} s wall {warm['cpu_s']:5.2f} s CPU | {modules}",
        flush=True,
    )
    if peer and cold["modules"]:
        old_cold, old_warm = cold_and_warm(package, threads, False, peer)
        print(
            f"{'  peer':<24} cold {old_cold['wall_s']:6.1f} s wall {old_cold['cpu_s']:6.1f} s CPU | "
            f"warm {old_warm['wall_s']:5.2f} s wall {old_warm['cpu_s']:5.2f} s CPU | now/peer: cold CPU "
            f"{cold['cpu_s'] / old_cold['cpu_s']:.2f}, cold wall {cold['wall_s'] / old_cold['wall_s']:.2f}, "
            f"warm wall {warm['wall_s'] / old_warm['wall_s']:.2f}",
            flush=True,
        )
    if breakdown and cold["modules"]:
        for name, signatures, seconds, llvm in cold["breakdown"]:
            print(f"    {name:<44} {signatures} sig  {seconds:6.2f} s (LLVM lock {llvm:5.2f})")
        passes = sorted(cold["passes"].items(), key=lambda item: -item[1])
        print(f"    compiler passes, CPU s per function ({sum(s for _, s in passes):.1f} s in all):")
        for name, seconds in passes[:25]:
            print(f"      {name:<60} {seconds:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", help="labels, comma-separated (default: every package, then all)")
    parser.add_argument("--threads", type=int, default=1, help="the Session's (the agent serves on 1)")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--peer", default="", help="another checkout's root, its engine/ measured alike")
    parser.add_argument("--child", nargs=3, metavar=("PACKAGE", "CACHE", "THREADS"), help=argparse.SUPPRESS)
    parser.add_argument("--engine-root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.breakdown, args.engine_root)
        return
    found = {label: str(path) for label, path in packages().items()} | {"all": "all"}
    labels = args.models.split(",") if args.models else list(found)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{stamp}, Session(threads={args.threads}), load {_load()}", flush=True)
    for label in labels:
        measure(label, found[label], args.threads, args.breakdown, args.peer)
    print(f"load after: {_load()}")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


if __name__ == "__main__":
    main()
