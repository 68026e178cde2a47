"""Ferry's engine side by side with onnxruntime and onnx's ReferenceEvaluator, in one run.

    .venv/bin/python bench/engine.py [--models resnet18,vit_tiny] [--rounds 10]

For each of the five benchmark models (bench/models.py, exported once to var/bench/) this
converts the ONNX file to a Ferry package, then times Ferry (1 and 2 threads), onnxruntime
(intra_op_num_threads 1 and 2) and ReferenceEvaluator interleaved in this process: a
warm-up, then several rounds whose order rotates, so machine noise hits every runtime
alike.  Load time (import, session creation, first result) and peak RSS are measured in
fresh processes per runtime (median of three), so one runtime's memory never counts against
another; engine/ is byte-compiled first, as installing it would.  Each model's int8 package
and its int8 package with static int8 activations (``--quantized``: int8, int8a, int4, several
or none) are timed too, when the converter can make them, against onnxruntime on the fp32
model and against Ferry's own fp32 package.

It prints a table; it is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import device_blas  # noqa: E402  (first: it may re-execute this command)

device_blas.unset_overrides()

import numpy as np  # noqa: E402  (after the re-exec above)

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

import core_latency  # noqa: E402  (bench/ is not a package)
import models  # noqa: E402


def feeds_for(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for an ONNX model: N(0,1) floats, token ids below 1000 for int64 inputs."""
    import onnx  # noqa: PLC0415 - not in the fresh processes that measure RSS

    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value or 1 for d in tensor.shape.dim]
        if tensor.elem_type == onnx.TensorProto.INT64:
            feeds[value.name] = rng.integers(0, 1000, shape).astype(np.int64)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def flops(path: Path) -> float:
    """Multiply-adds x2 of the Conv, ConvTranspose, MatMul and Gemm nodes (the rest is noise)."""
    import onnx  # noqa: PLC0415

    # data_prop resolves dims computed from shape arithmetic (ViT's class-token Expand): without
    # it half of ViT's MatMuls had a symbolic batch dim and counted as nothing.
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)), data_prop=True)
    shapes = {}
    for value in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        shapes[value.name] = [d.dim_value for d in value.type.tensor_type.shape.dim]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    total, unresolved = 0.0, 0
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            known = [shapes.get(node.input[0]), shapes.get(node.input[1]), shapes.get(node.output[0])]
            unresolved += not all(dims and all(dims) for dims in known)
        if node.op_type in ("Conv", "ConvTranspose"):
            w, y = shapes.get(node.input[1]), shapes.get(node.output[0])
            if w and y:
                total += 2.0 * np.prod(y, dtype=np.float64) * np.prod(w[1:], dtype=np.float64)
        elif node.op_type in ("MatMul", "Gemm"):
            a, y = shapes.get(node.input[0]), shapes.get(node.output[0])
            if a and y:
                trans_a = any(att.name == "transA" and att.i for att in node.attribute)
                k = a[-2] if node.op_type == "Gemm" and trans_a else a[-1]
                total += 2.0 * np.prod(y, dtype=np.float64) * k
    if unresolved:
        note = f"{unresolved} GEMM-like nodes without static shapes; GFLOP/s undercounted"
        print(f"  {path.stem}: {note}", file=sys.stderr)
    return total


# -- fresh-process measurement of load time and peak RSS -------------------------------------------


def child(runtime: str, path: str, feeds_path: str, threads: int) -> None:
    """Runs in its own process: load, first result, three more runs; print load time and peak RSS.

    The feeds come from an .npz file: building them from the ONNX file would load its weights
    into this process and count them in its RSS."""
    stages = {"rss_python": _rss_mb()}  # interpreter, numpy and this script
    with np.load(feeds_path) as data:
        feeds = {name: data[name] for name in data.files}
    stages["rss_feeds"] = _rss_mb()
    start = time.perf_counter()
    if runtime in ("ferry", "ferry-numpy"):
        from engine import Session

        stages["rss_import"] = _rss_mb()
        session = Session(path, threads=threads, jit=runtime == "ferry")
        run = lambda: session.run(feeds)  # noqa: E731
    else:
        import onnxruntime as ort

        stages["rss_import"] = _rss_mb()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        run = lambda: session.run(None, feeds)  # noqa: E731
    stages["rss_session"] = _rss_mb("VmHWM")  # the high-water mark: loading may peak and fall
    file_before = _rss_mb("RssFile")
    run()
    load = time.perf_counter() - start
    for _ in range(3):
        run()
    # file pages the runs first touched: the weights, and library code first used in a run
    stages["rss_runs_file"] = _rss_mb("RssFile") - file_before
    print(json.dumps({"load_s": load, "peak_rss_mb": _peak_rss_mb(), **stages}))


def jit_child(cache: str) -> None:
    """Runs in its own process: compile (or load from ``cache``) every JIT kernel, print seconds."""
    from engine import jit  # noqa: PLC0415

    print(json.dumps({"jit_load_s": jit.load(cache)}))


def jit_compile_times() -> tuple[float, float] | None:
    """(first-ever compile, warm-cache load) of the JIT kernels, each in a fresh process, or None
    without numba."""
    from engine import jit  # noqa: PLC0415

    if not jit.enabled():
        return None
    with tempfile.TemporaryDirectory(prefix="ferry-bench-jit-") as cache:
        times = []
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, __file__, "--jit-child", cache], capture_output=True, text=True, check=True
            )
            times.append(json.loads(out.stdout.strip().splitlines()[-1])["jit_load_s"])
    return times[0], times[1]


def _rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _peak_rss_mb() -> float:
    """VmHWM of this process: unlike getrusage's ru_maxrss it is not inherited from the parent
    across fork+exec (which would report the benchmark's own peak for every child)."""
    return _rss_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


FRESH_PROCESSES = 3  # per runtime and model: the median of each figure (one process is noisy here)


def in_fresh_process(
    runtime: str, path: Path, feeds: dict[str, np.ndarray], threads: int = 1
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ferry-bench-feeds-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        np.savez(feeds_path, **feeds)
        figures = [_one_fresh_process(runtime, path, feeds_path, threads) for _ in range(FRESH_PROCESSES)]
    # the load time's median over all; the RSS figures all from the process of median peak, so
    # its stages add up to its peak
    by_peak = sorted(figures, key=lambda f: f["peak_rss_mb"])
    return {**by_peak[len(by_peak) // 2], "load_s": statistics.median(f["load_s"] for f in figures)}


def _one_fresh_process(runtime: str, path: Path, feeds_path: Path, threads: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", runtime, str(path), str(feeds_path), str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_engine() -> None:
    """Byte-compile engine/ as installing it would: onnxruntime's and numpy's modules were
    compiled by pip, while an editable checkout (with PYTHONDONTWRITEBYTECODE, as here) would
    compile Ferry's from source in every fresh process and count that as load time."""
    import engine  # noqa: PLC0415

    compileall.compile_dir(Path(engine.__file__).parent, quiet=1)


# -- interleaved timing --------------------------------------------------------------------------


@dataclass
class Runner:
    name: str
    run: Callable[[], object]
    rounds: int  # how many rounds this runner takes part in (ReferenceEvaluator is slow)
    times: list[float] = field(default_factory=list)

    def median_ms(self) -> float:
        # nan for a runner left out (--ref-rounds 0): its column prints as nan
        return statistics.median(self.times) * 1e3 if self.times else float("nan")

    def min_ms(self) -> float:
        return min(self.times) * 1e3


def interleave(runners: list[Runner], rounds: int, settle: float = 0.0) -> None:
    """Warm up, then run ``rounds`` rounds in rotating order; ``settle`` seconds of sleep
    before each timed run let the previous runtime's spinning pool threads go idle."""
    for _ in range(2):  # warm-up: Ferry records on its first run and plans on its second
        for runner in runners:
            runner.run()
    for round_ in range(rounds):
        order = runners[round_ % len(runners) :] + runners[: round_ % len(runners)]
        for runner in order:
            if len(runner.times) < runner.rounds:
                time.sleep(settle)
                start = time.perf_counter()
                runner.run()
                runner.times.append(time.perf_counter() - start)


def ferry_runner(
    name: str, package: Path, feeds: dict, threads: int, rounds: int, jit: bool = True
) -> tuple[Runner, object]:
    from engine import Session

    session = Session(package, threads=threads, jit=jit)
    return Runner(name, lambda: session.run(feeds), rounds), session


def one_blas_thread(run: Callable[[], object]) -> Callable[[], object]:
    """ReferenceEvaluator's matmuls go to numpy's BLAS: cap it at one thread, like the runtimes
    it is compared with in the 1-thread phase."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    def limited() -> object:
        with threadpool_limits(limits=1):
            return run()

    return limited


def ort_runner(name: str, onnx_path: Path, feeds: dict, threads: int, rounds: int) -> tuple[Runner, object]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return Runner(name, lambda: session.run(None, feeds), rounds), session


def convert_package(
    onnx_path: Path, out_dir: Path, quantize: str | None = None, feeds: dict | None = None
) -> Path | None:
    """``quantize``: None, "int8", "int4", "int8a": int8 weights and static int8 activations
    calibrated (min/max) on ``feeds``, the bench's own inputs, or "int8d": int8 weights and
    dynamic int8 activations (DynamicQuantizeLinear, no calibration)."""
    from converter import convert
    from converter.errors import ConversionError

    package = out_dir / f"{onnx_path.stem}{'-' + quantize if quantize else ''}.ferry"
    options: dict = {"quantize": quantize}
    if quantize == "int8a":
        options = {"quantize": "int8", "activations": "minmax", "calibration": feeds}
    if quantize == "int8d":
        options = {"quantize": "int8", "activations": "dynamic"}
    try:
        convert(onnx_path, package, **options)
    except ConversionError as exc:
        print(f"  {onnx_path.stem} {quantize}: not converted ({exc})", file=sys.stderr)
        return None
    return package


def ort_dynamic_model(onnx_path: Path, out_dir: Path) -> Path | None:
    """onnxruntime's own dynamic int8 form of the model (quantize_dynamic: int8 weights,
    DynamicQuantizeLinear activations), the peer of Ferry's int8d package; None if onnxruntime
    cannot make or run it."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = out_dir / f"{onnx_path.stem}-ort-int8d.onnx"
    try:
        quantize_dynamic(onnx_path, target, weight_type=QuantType.QInt8)
        ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure: that peer is left out
        print(f"  {onnx_path.stem}: onnxruntime quantize_dynamic failed ({exc})", file=sys.stderr)
        return None
    return target


def bench_model(
    name: str, out_dir: Path, rounds: int, ref_rounds: int, quantized: tuple[str, ...] = ("int8",)
) -> list[dict]:
    """Ferry numpy-only and Ferry with its JIT tier beside onnxruntime, 1 and 2 threads."""
    from onnx.reference import ReferenceEvaluator

    from engine import Session

    onnx_path = models.ALL[name]()
    feeds = feeds_for(onnx_path)
    package = convert_package(onnx_path, out_dir)
    variants = [("fp32", package)] + [(q, convert_package(onnx_path, out_dir, q, feeds)) for q in quantized]
    ort1, ort_session = ort_runner("ort1", onnx_path, feeds, 1, rounds)
    ort2, _ = ort_runner("ort2", onnx_path, feeds, 2, rounds)
    ort_dynamic = ort_dynamic_model(onnx_path, out_dir) if "int8d" in quantized else None
    ort1d = ort_runner("ort1-int8d", ort_dynamic, feeds, 1, rounds)[0] if ort_dynamic else None
    reference = ReferenceEvaluator(str(onnx_path))
    ref = Runner("ref", one_blas_thread(lambda: reference.run(None, feeds)), ref_rounds)
    ferry: dict[tuple[str, str, int], Runner] = {}
    for label, pkg in variants:
        for tier in ("numpy", "jit"):
            for threads in (1, 2):
                if pkg is not None:
                    ferry[label, tier, threads], _ = ferry_runner(
                        f"{label}-{tier}{threads}", pkg, feeds, threads, rounds, jit=tier == "jit"
                    )
    # 1-thread and 2-thread runtimes in separate phases, with a pause before each 2-thread
    # run: idle pool threads of a 2-thread session (onnxruntime's, OpenBLAS's, numba's) spin for
    # a while after each run and would starve whatever runs next on a 2-core machine.  OpenBLAS's
    # spin for ~2^28 cycles (its THREAD_TIMEOUT, ~0.09 s here) after a call, calling sched_yield:
    # Ferry numpy-only's were still spinning through the JIT session's next run, sharing the core
    # with its team worker (MobileNetV2 2-thread 11.2 ms, 7.5 alone), so the numpy-only 2-thread
    # runs get a phase of their own.  (A longer pause let OpenBLAS's threads fall asleep instead,
    # and every BLAS-bound 2-thread run then paid their wake: the GPT step 6.2 -> 8.5 ms.)
    peers = [ort1, ref] + ([ort1d] if ort1d is not None else [])
    interleave([*(r for k, r in ferry.items() if k[2] == 1), *peers], rounds)
    round_trip = core_latency.round_trip_ns()  # where the host has put the two vCPUs now
    interleave([*(r for k, r in ferry.items() if k[2] == 2 and k[1] == "jit"), ort2], rounds, settle=0.05)
    interleave([r for k, r in ferry.items() if k[2] == 2 and k[1] == "numpy"], rounds, settle=0.05)

    expected = ort_session.run(None, feeds)
    gflop = flops(onnx_path) / 1e9
    ort_fresh = in_fresh_process("ort", onnx_path, feeds)
    rows = []
    for label, pkg in variants:
        if pkg is None:
            rows.append({"model": name, "variant": label, "missing": True})
            continue
        got = Session(pkg, threads=1).run(feeds)
        diff = max(
            float(np.max(np.abs(got[key].astype(np.float64) - want))) / max(1.0, float(np.max(np.abs(want))))
            for key, want in zip(got, expected, strict=True)
        )
        fresh = in_fresh_process("ferry", pkg, feeds)
        fresh_numpy = in_fresh_process("ferry-numpy", pkg, feeds)
        jit1 = ferry[label, "jit", 1]
        rows.append(
            {
                "model": name,
                "variant": label,
                "numpy1": ferry[label, "numpy", 1].median_ms(),
                "jit1": (jit1.median_ms(), jit1.min_ms()),
                "ort1": (ort1.median_ms(), ort1.min_ms()),
                "numpy2_min": ferry[label, "numpy", 2].min_ms(),
                "jit2_min": ferry[label, "jit", 2].min_ms(),
                "ort2_min": ort2.min_ms(),
                "ref": ref.median_ms(),
                "gflops": gflop / (jit1.median_ms() / 1e3),
                "ort_gflops": gflop / (ort1.median_ms() / 1e3),
                "load": (fresh["load_s"] * 1e3, ort_fresh["load_s"] * 1e3),
                "rss": (fresh["peak_rss_mb"], ort_fresh["peak_rss_mb"]),
                "rss_numpy": fresh_numpy["peak_rss_mb"],
                "rss_stages": {k: v for k, v in fresh.items() if k.startswith("rss_")},
                "rel_diff": diff,
                "round_trip_ns": round_trip,
                **({"ort1_own": ort1d.median_ms()} if label == "int8d" and ort1d is not None else {}),
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'model':<20}{'np1':>7}{'jit1 med/min':>14}{'ort1 med/min':>14}{'np/o':>6}{'jit/o':>6}"
        f"{'np2':>7}{'jit2':>7}{'ort2':>7}{'jit/o2':>7}{'x ref':>7}{'GF/s j/o':>10}{'load j/o':>11}"
        f"{'RSS np/jit/ort':>16}{'rel diff':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        label = r["model"] + ("" if r["variant"] == "fp32" else f" {r['variant']}")
        if r.get("missing"):
            print(f"{label:<20}  not converted")
            continue
        j1, o1 = r["jit1"], r["ort1"]
        print(
            f"{label:<20}{r['numpy1']:7.1f}{j1[0]:7.1f}/{j1[1]:<6.1f}{o1[0]:7.1f}/{o1[1]:<6.1f}"
            f"{r['numpy1'] / o1[0]:6.2f}{j1[0] / o1[0]:6.2f}"
            f"{r['numpy2_min']:7.1f}{r['jit2_min']:7.1f}{r['ort2_min']:7.1f}"
            f"{r['jit2_min'] / r['ort2_min']:7.2f}"
            f"{r['ref'] / j1[0]:7.0f}{r['gflops']:5.0f}/{r['ort_gflops']:<4.0f}"
            f"{r['load'][0]:6.0f}/{r['load'][1]:<4.0f}"
            f"{r['rss_numpy']:6.0f}/{r['rss'][0]:.0f}/{r['rss'][1]:<4.0f}{r['rel_diff']:9.1e}"
        )
    fp32 = [r for r in rows if r["variant"] == "fp32" and not r.get("missing")]
    if fp32:
        for key, label in (("numpy1", "numpy 1t"), ("jit1", "JIT 1t")):
            ratios = [(r[key] if key == "numpy1" else r[key][0]) / r["ort1"][0] for r in fp32]
            print(f"geomean Ferry {label} / onnxruntime: {statistics.geometric_mean(ratios):.2f}")
        for key, label in (("numpy2_min", "numpy 2t"), ("jit2_min", "JIT 2t")):
            ratios = [r[key] / r["ort2_min"] for r in fp32]
            print(f"geomean Ferry {label} / onnxruntime (minimums): {statistics.geometric_mean(ratios):.2f}")
        trips = [f"{r['model']} {r['round_trip_ns']:.0f}" for r in fp32 if r.get("round_trip_ns")]
        if trips:
            print(
                "CPU0 <-> CPU1 round trip (ns) at each model's 2-thread phase (bench/core_latency.py; "
                "~60 neighbouring cores, ~350 different chiplets): " + ", ".join(trips)
            )
    for note in variant_notes(rows):
        print(note)


def variant_notes(rows: list[dict]) -> list[str]:
    """Each quantized variant against its model's fp32 package: time vs onnxruntime fp32, peak RSS."""
    fp32 = {r["model"]: r for r in rows if r["variant"] == "fp32" and not r.get("missing")}
    notes = []
    for r in rows:
        base = fp32.get(r["model"])
        if r["variant"] == "fp32" or r.get("missing") or base is None:
            continue
        notes.append(
            f"{r['model']} {r['variant']}: JIT {r['jit1'][0] / r['ort1'][0]:.2f}x onnxruntime fp32 time, "
            f"{base['jit1'][0] / r['jit1'][0]:.2f}x faster than Ferry fp32 (numpy-only "
            f"{base['numpy1'] / r['numpy1']:.2f}x), "
            f"peak RSS {r['rss'][0]:.0f} MB = {100 * r['rss'][0] / base['rss'][0]:.0f}% of Ferry fp32's"
            + _own_peer(r)
        )
        notes.extend(f"  {label}: {_rss_growth(row)}" for label, row in (("fp32", base), (r["variant"], r)))
    return notes


def _own_peer(row: dict) -> str:
    """onnxruntime on its quantize_dynamic of the model (int8d rows), when it ran."""
    if "ort1_own" not in row:
        return ""
    own = row["ort1_own"]
    return (
        f"; onnxruntime quantize_dynamic {own:.1f} ms = {row['ort1'][0] / own:.2f}x faster than its fp32, "
        f"Ferry int8d JIT / it {row['jit1'][0] / own:.2f}"
    )


def _rss_growth(row: dict) -> str:
    """Where a fresh process's peak RSS came from (MB): what is there before the engine, what
    importing and loading it add, and the rest of the peak, which the runs add."""
    st = row["rss_stages"]
    return (
        f"interpreter+numpy {st['rss_python']:.0f}, feeds +{st['rss_feeds'] - st['rss_python']:.0f}, "
        f"engine import +{st['rss_import'] - st['rss_feeds']:.0f}, "
        f"session +{st['rss_session'] - st['rss_import']:.0f}, "
        f"runs +{row['rss'][0] - st['rss_session']:.0f} (of which file pages first read, the weights "
        f"and library code, {st['rss_runs_file']:.0f}) = peak {row['rss'][0]:.0f}"
    )


def _blas() -> str:
    """numpy's BLAS and the kernel set it picked (OpenBLAS honours OPENBLAS_CORETYPE): tables
    are comparable only with the same BLAS build and kernel set."""
    from threadpoolctl import threadpool_info  # noqa: PLC0415

    found = [f"{p.get('internal_api')} {p.get('architecture')}" for p in threadpool_info()]
    return ", ".join(found) or "unknown BLAS"


def _numpy_simd() -> str:
    """The widest of numpy's SIMD dispatch targets this CPU runs (X86_V3 is AVX2, X86_V4
    AVX-512): float32 exp and exp2 are vectorised on some and scalar on others, which moves
    every softmax and GELU; and the forms engine.ops.fastmath picked here because of it."""
    from numpy._core import _multiarray_umath as umath  # noqa: PLC0415 - numpy's own runtime report

    from engine.ops.fastmath import chosen_forms  # noqa: PLC0415

    found = [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]
    forms = ", ".join(f"{name} as {form}" for name, form in chosen_forms().items())
    return f"numpy SIMD {found[-1] if found else ' '.join(umath.__cpu_baseline__)}; Ferry's {forms}"


def _jit_note(times: tuple[float, float] | None) -> str:
    if times is None:
        return "no JIT tier (numba not installed): the jit columns are numpy-only too"
    import numba  # noqa: PLC0415

    return f"numba {numba.__version__} (first compile {times[0]:.1f} s, warm-cache load {times[1]:.2f} s)"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(models.ALL))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ref-rounds", type=int, default=2)
    parser.add_argument(
        "--quantized",
        default="int8,int8a",
        help="quantized packages to time beside fp32: int8, int4, int8a (int8 weights and static int8 "
        "activations calibrated on the bench's inputs), int8d (int8 weights and dynamic int8 "
        "activations, also timed against onnxruntime's quantize_dynamic), several comma-separated, or none",
    )
    parser.add_argument(
        "--child", nargs=4, metavar=("RUNTIME", "PATH", "FEEDS", "THREADS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--jit-child", metavar="CACHE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jit_child:
        jit_child(args.jit_child)
        return
    if args.child:
        runtime, path, feeds_path, threads = args.child
        child(runtime, path, feeds_path, int(threads))
        return
    compile_engine()
    jit_times = jit_compile_times()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmp:
        for name in args.models.split(","):
            print(f"benchmarking {name}...", file=sys.stderr)
            quantized = tuple(q for q in args.quantized.split(",") if q and q != "none")
            rows += bench_model(name, Path(tmp), args.rounds, args.ref_rounds, quantized)
    import onnxruntime

    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {_cpu()}, "
        f"{device_blas.unset_note()}; "
        f"{_jit_note(jit_times)}; "
        f"numpy {np.__version__} on {_blas()} ({_numpy_simd()}), onnxruntime {onnxruntime.__version__}; "
        "times in ms; np = Ferry numpy-only, jit = Ferry with its JIT tier, ort = onnxruntime; "
        "1 = 1 thread (medians, and minimums), 2 = 2-thread sessions' minimums (Ferry's planned runs go "
        "to one thread where its recent runs found that faster); np/o, jit/o = Ferry/onnxruntime; "
        "x ref = times faster than ReferenceEvaluator (1 BLAS thread) for Ferry JIT; "
        "rel diff = max abs difference to onnxruntime "
        "/ max(1, max |onnxruntime|); load, RSS = median of 3 fresh processes (peak RSS)\n"
    )
    print_table(rows)


if __name__ == "__main__":
    main()
