"""Where each runtime spends a model's time: Ferry's per-node profile beside onnxruntime's, by op;
and what each of Ferry's math forms (engine.ops.fastmath) costs in the whole model here.

    .venv/bin/python bench/engine_breakdown.py [--models vit_tiny,bert_encoder] [--runs 20]
        [--tiers numpy,jit] [--nodes] [--threads 1]

For each benchmark model (bench/models.py) this converts the ONNX file to a Ferry package,
then, at one thread (``--threads``: more, both runtimes alike), sums ``Session.profile``
times per (op, kernel) for Ferry (numpy-only, and with its JIT tier where numba is
installed: JIT kernels are named ``*_jit*``) and
onnxruntime's own profiler (``enable_profiling``) per op type, over the same number of runs
of the same feeds, and prints the two lists side by side with their totals.  The op names
differ (Ferry's FusedMatMul is a GEMM, its bias and activation; onnxruntime fuses its own
way), so read it as "where the time goes", not as a per-row ratio.  ``--nodes`` also lists each
Conv node beside onnxruntime's (its fused convs included) where onnxruntime's fusions
kept one, paired in graph order (MobileNetV2's and ResNet18's convs map one to one), with the
ratio of each pair.

Then it times the model with fastmath's forms forced in turn (np.exp2 with the np.exp2 GELU
polynomial, as before fastmath measured anything; exp(x ln 2) with the np.exp polynomial;
exp(x ln 2) with the table GELU), interleaved in rotating order in one process so machine noise
hits every form alike: the whole model, and each GELU call inside it (far steadier on a noisy
machine).  Last, the ns per element of numpy's exponentials and of each GELU form.

It prints figures; it is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import models  # noqa: E402  (bench/ is not a package)

from engine import Session  # noqa: E402
from engine.ops import fastmath  # noqa: E402

TOP = 10  # rows per runtime


def ferry_breakdown(
    package: Path, feeds: dict, runs: int, jit: bool = True, threads: int = 1
) -> dict[str, float]:
    """Median ms per run of each (op, kernel), summed over the nodes that ran it; ``jit=False``:
    Ferry numpy-only."""
    session = Session(package, threads=threads, jit=jit)
    for _ in range(3):  # record, plan, search: the profile shows what later runs do
        session.run(feeds)
    profiles = [session.profile(feeds) for _ in range(runs)]
    totals: dict[str, float] = collections.defaultdict(float)
    for position, timing in enumerate(profiles[0]):
        seconds = float(np.median([profile[position].seconds for profile in profiles]))
        totals[f"{timing.op} ({timing.kernel.rsplit('.', 1)[-1]})"] += seconds * 1e3
    return totals


def ferry_nodes(package: Path, feeds: dict, runs: int, threads: int = 1) -> list[tuple[str, str, float]]:
    """(node, kernel, median ms) of each Conv / FusedConv node with the JIT tier, graph order."""
    session = Session(package, threads=threads)
    for _ in range(3):
        session.run(feeds)
    profiles = [session.profile(feeds) for _ in range(runs)]
    return [
        (t.node, t.kernel.rsplit(".", 1)[-1], float(np.median([p[i].seconds for p in profiles])) * 1e3)
        for i, t in enumerate(profiles[0])
        if t.op in ("Conv", "FusedConv")
    ]


def ort_nodes(onnx_path: Path, feeds: dict, runs: int, threads: int = 1) -> list[tuple[str, float]]:
    """(node, median ms) of each onnxruntime Conv node (its fused ones included), run order."""
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="ferry-breakdown-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        for _ in range(3 + runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run"][-runs:]
    per_node: dict[str, list[float]] = {}
    for e in events:
        conv = (
            e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and "Conv" in e["args"]["op_name"]
        )
        if conv and any(start <= e["ts"] <= stop for start, stop in windows):
            per_node.setdefault(e["name"].removesuffix("_kernel_time"), []).append(e["dur"] / 1e3)
    return [(name, statistics.median(durations)) for name, durations in per_node.items()]


def print_nodes(
    name: str, ferry: list[tuple[str, str, float]], ort: list[tuple[str, float]], threads: int = 1
) -> None:
    """Ferry's conv nodes beside onnxruntime's, paired in order (both keep one node per conv)."""
    print(f"\n{name}: conv nodes, Ferry JIT beside onnxruntime ({_threads(threads)}, median ms)")
    if len(ferry) != len(ort):
        print(f"  ({len(ferry)} Ferry and {len(ort)} onnxruntime conv nodes: pairs may not match)")
    for (node, kernel, f_ms), (_, o_ms) in zip(ferry, ort, strict=False):
        print(f"  {node[-38:]:<38} {kernel[:30]:<30} {f_ms:7.3f} {o_ms:7.3f} {f_ms / o_ms:6.2f}x")
    f_total, o_total = sum(f[2] for f in ferry), sum(o[1] for o in ort)
    print(f"  {'all conv nodes':<69} {f_total:7.3f} {o_total:7.3f} {f_total / o_total:6.2f}x")


def ort_breakdown(onnx_path: Path, feeds: dict, runs: int, threads: int = 1) -> dict[str, float]:
    """Median ms per run of each node, from onnxruntime's profiler (kernel time only), over the
    last ``runs`` of ``runs + 3`` runs, summed per op type: the median as Ferry's side takes it
    (a mean on a busy machine counted every preemption: 44.8 ms of Conv per MobileNetV2 run,
    against 7.6 ms summing each node's best)."""
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="ferry-breakdown-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        for _ in range(3 + runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run"][-runs:]
    per_node: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    for event in kernels:
        if any(start <= event["ts"] <= stop for start, stop in windows):
            per_node[event["args"]["op_name"], event["name"]].append(event["dur"] / 1e3)
    totals: dict[str, float] = collections.defaultdict(float)
    for (op, _), durations in per_node.items():
        totals[op] += statistics.median(durations)
    return totals


def _threads(threads: int) -> str:
    return "1 thread" if threads == 1 else f"{threads} threads"


def print_side_by_side(name: str, ferry: dict[str, float], ort: dict[str, float], threads: int = 1) -> None:
    left = sorted(ferry.items(), key=lambda item: -item[1])[:TOP]
    right = sorted(ort.items(), key=lambda item: -item[1])[:TOP]
    total = f"Ferry {sum(ferry.values()):.2f} ms, onnxruntime {sum(ort.values()):.2f} ms"
    print(f"\n{name}: {total} ({_threads(threads)})")
    print(f"{'Ferry op (kernel)':<44}{'ms':>8}    {'onnxruntime op':<28}{'ms':>8}")
    for row in range(max(len(left), len(right))):
        f_name, f_ms = left[row] if row < len(left) else ("", None)
        o_name, o_ms = right[row] if row < len(right) else ("", None)
        f_cell = f"{f_ms:8.2f}" if f_ms is not None else " " * 8
        o_cell = f"{o_ms:8.2f}" if o_ms is not None else ""
        print(f"{f_name[:43]:<44}{f_cell}    {o_name[:27]:<28}{o_cell}")


# (exp2 via np.exp, GELU by table) per label; the first is what the engine used before fastmath
# measured anything.
FORMS = {
    "exp2, poly exp2": (False, False),
    "exp, poly exp": (True, False),
    "exp, table": (True, True),
}


def forms_ab(package: Path, feeds: dict, runs: int) -> dict[str, dict[str, list[float]]]:
    """Per FORMS label, the whole model's seconds per run and each GELU call's seconds inside
    those runs (forms forced with fastmath.forced_forms; the fused GELU timed where the kernels
    call it, by patching that module attribute: bench code).  A GELU call's time is far
    steadier than the whole model's on a noisy machine."""
    from engine.ops import fused  # noqa: PLC0415

    session = Session(package, threads=1)
    for _ in range(3):
        session.run(feeds)
    gelu_into = fused.gelu_into
    times = {label: {"model": [], "gelu": []} for label in FORMS}
    labels = list(FORMS)
    current = [labels[0]]  # the label being timed, for timed_gelu

    def timed_gelu(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        result = gelu_into(x, out)
        times[current[0]]["gelu"].append(time.perf_counter() - start)
        return result

    fused.gelu_into = timed_gelu
    try:
        for run in range(runs):
            for label in labels[run % len(labels) :] + labels[: run % len(labels)]:
                current[0] = label
                with fastmath.forced_forms(*FORMS[label]):
                    start = time.perf_counter()
                    session.run(feeds)
                    times[label]["model"].append(time.perf_counter() - start)
    finally:
        fused.gelu_into = gelu_into
    return times


def print_forms(name: str, times: dict[str, dict[str, list[float]]]) -> None:
    first = times[next(iter(FORMS))]
    parts = (
        ("model", "whole model", "{:.2f} ms", 1e3),
        ("gelu", "each GELU call in the model", "{:.0f} us", 1e6),
    )
    for part, what, unit, scale in parts:
        if not first[part]:
            continue
        base = statistics.median(first[part])
        medians = {label: statistics.median(t[part]) for label, t in times.items()}
        cells = [f"{label}: {unit.format(m * scale)} ({m / base:.3f})" for label, m in medians.items()]
        print(f"{name}, {what} by math form (median, vs the first): " + "; ".join(cells))


def math_costs() -> dict[str, float]:
    """ns per element of numpy's float32 exponentials and of each GELU form, best of 20 calls on
    fastmath's own cache-sized sample (after the engine's allocator setting, as in a run)."""
    from engine.allocator import tune_malloc  # noqa: PLC0415

    tune_malloc()
    x = fastmath._sample()
    out = np.empty_like(x)
    forms = {
        "np.exp": lambda: np.exp(x, out=out),
        "np.exp2": lambda: np.exp2(x, out=out),
        "np.multiply (one simple pass)": lambda: np.multiply(x, x, out=out),
        "GELU table": lambda: fastmath.gelu_table_into(x, out),
        "GELU polynomial, exp": lambda: fastmath.gelu_polynomial_into(x, out, natural=True),
        "GELU polynomial, exp2": lambda: fastmath.gelu_polynomial_into(x, out, natural=False),
    }
    costs = {}
    for name, form in forms.items():
        form()
        best = min(_seconds(form) for _ in range(20))
        costs[name] = best / x.size * 1e9
    return costs


def _seconds(form) -> float:
    start = time.perf_counter()
    form()
    return time.perf_counter() - start


def _uses_math_forms(package: Path) -> bool:
    """Whether any node runs a GELU or an attention softmax (else the A/B would time noise)."""
    from engine.format import read_package  # noqa: PLC0415

    nodes = read_package(package).graph["nodes"]
    return any(n["op"] in ("Gelu", "FusedAttention") or n["attrs"].get("activation") == "Gelu" for n in nodes)


def _engine_bench():
    """bench/engine.py's feeds and conversion (imported by path: as ``engine`` it would shadow
    the engine package)."""
    spec = importlib.util.spec_from_file_location("engine_bench", BENCH / "engine.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="vit_tiny,bert_encoder")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tiers", default="numpy,jit", help="Ferry's kernel tiers to profile (numpy, jit)")
    parser.add_argument("--nodes", action="store_true", help="each conv node beside onnxruntime's")
    parser.add_argument("--threads", type=int, default=1, help="each runtime's intra-op threads")
    args = parser.parse_args()
    helpers = _engine_bench()
    forms = []
    with tempfile.TemporaryDirectory(prefix="ferry-breakdown-") as tmp:
        for name in args.models.split(","):
            onnx_path = models.ALL[name]()
            feeds = helpers.feeds_for(onnx_path)
            package = helpers.convert_package(onnx_path, Path(tmp))
            threads = args.threads
            ort = ort_breakdown(onnx_path, feeds, args.runs, threads)
            for tier in args.tiers.split(","):
                ferry = ferry_breakdown(package, feeds, args.runs, jit=tier == "jit", threads=threads)
                print_side_by_side(f"{name} [Ferry {tier}]", ferry, ort, threads)
            if args.nodes:
                ferry_convs = ferry_nodes(package, feeds, args.runs, threads)
                print_nodes(name, ferry_convs, ort_nodes(onnx_path, feeds, args.runs, threads), threads)
            if _uses_math_forms(package):
                forms.append((name, forms_ab(package, feeds, 2 * args.runs)))
        print()
        for name, times in forms:
            print_forms(name, times)
    print(f"\nFerry's math forms here (measured once per process): {fastmath.chosen_forms()}")
    costs = ", ".join(f"{name} {ns:.2f}" for name, ns in math_costs().items())
    print(f"ns per float32 element ({fastmath.SAMPLE} elements, best of 20): {costs}")


if __name__ == "__main__":
    main()
