"""Semi-automatic kernel search (MNN's idea): measure a heavy node's candidate kernels once on
this device, keep the fastest, and remember the choice.

For ops with several correct kernels (Conv: im2col variants, GEMMs for 1x1 and patch convs,
Winograd for 3x3 stride 1 and 2, depthwise in two layouts, see ``conv.conv_candidates``;
FusedAttention: batched or per head), the planner asks ``KernelSearch.choose`` which one a
node runs.  The first time, each candidate runs on the node's real weights and an input of
the recorded shape (best of a few rounds over all candidates; a candidate whose result
differs from the selector's choice is dropped).  The choice is
cached in a JSON file per (model digest, device fingerprint) under ``FERRY_KERNEL_CACHE``
(default ``~/.cache/ferry/kernels``), so later loads of the same model on the same device
skip the measuring.  Each choice also records which candidates it was made among: when an
engine upgrade adds a kernel, or a node's weights become packable, the node is measured
again (a cached choice among fewer kernels would otherwise hold forever); any change to the
engine's code re-measures every node once (a kernel rewritten under its old name).
``FERRY_KERNEL_SEARCH=0`` turns measuring off (the selector decides).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine import jit, kernels
from engine.ops.registry import Kernel, kernel_name
from engine.planner import memory_order

# called with a candidate's inputs before each timed call: puts its weights where a run finds them
Evictor = Callable[[list[np.ndarray | None]], None]

RUNS = 5  # timed rounds over the candidates (after one checked run each); each one's minimum counts
PACKED_MARGIN = 0.85  # a kernel with pre-packed weights must take <= 85% of the default's time...
SMALL_PACK_BYTES = 4 << 20  # ...or <= 95% when its packed copy adds at most this much memory
SMALL_PACK_MARGIN = 0.95
CLOSE_CALL = 1.10  # the two fastest within 10%: timed for RUNS more rounds before choosing
CHANNELS_LAST = (0, 2, 3, 1)  # planner.memory_order of an NCHW value laid out channels last


def enabled() -> bool:
    return os.environ.get("FERRY_KERNEL_SEARCH", "1") != "0"


def cache_dir() -> Path:
    configured = os.environ.get("FERRY_KERNEL_CACHE")
    if configured:
        return Path(configured)
    try:
        return Path.home() / ".cache" / "ferry" / "kernels"
    except (RuntimeError, KeyError):  # no home directory (some service accounts)
        return Path(tempfile.gettempdir()) / "ferry-kernels"


def device_fingerprint(threads: int, use_jit: bool = True) -> str:
    """What makes timings comparable: CPU, its flags, numpy and BLAS build, thread count, the
    JIT tier (numba's version, or none) and the engine's own code: changing any of them
    re-measures."""
    from threadpoolctl import threadpool_info  # noqa: PLC0415 - only needed when searching

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            cpu = "".join(line for line in info if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        cpu = platform.processor()
    pools = _numpy_blas(threadpool_info())
    blas = [(p.get("internal_api"), p.get("architecture"), p.get("version")) for p in pools]
    machine = [
        platform.machine(),
        cpu,
        np.__version__,
        blas,
        threads,
        os.cpu_count(),
        jit.fingerprint() if use_jit else "numpy-only",
        jit.engine_digest(),
    ]
    text = json.dumps(machine, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _numpy_blas(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """numpy's own BLAS: other libraries (scipy's OpenBLAS, numba's OpenMP) join threadpool_info
    when something imports them, which must not change the fingerprint within one process."""
    blas = [p for p in pools if p.get("user_api") == "blas"]
    # a wheel's numpy carries its BLAS in numpy.libs; a distribution's links a system BLAS
    own = [p for p in blas if os.path.basename(os.path.dirname(str(p.get("filepath", "")))) == "numpy.libs"]
    return own or blas


class KernelSearch:
    """Kernel choices for one model on this device, measured once and cached on disk."""

    def __init__(self, model_digest: str, threads: int, use_jit: bool = True) -> None:
        self.threads = threads
        self.use_jit = use_jit and jit.enabled()
        self.path = cache_dir() / f"{model_digest[:24]}-{device_fingerprint(threads, self.use_jit)[:24]}.json"
        self.choices: dict[str, str] = self._load()
        self._dirty = False
        # node -> the memory order (planner.memory_order) of the chosen kernel's output, for the
        # nodes measured in this process: the session lays later nodes' measuring inputs out
        # the same way, so a channels-last kernel is timed on what its producer leaves it
        self.output_orders: dict[str, tuple[int, ...] | None] = {}

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def handles(self, op: str) -> bool:
        return enabled() and op in kernels.ops(self.use_jit)

    def choose(
        self,
        op: str,
        node: str,
        attrs: dict[str, Any],
        shapes: list[tuple[int, ...] | None],
        static: list[bool],
        make_inputs: Callable[[], list[np.ndarray | None]],
        default: Kernel | None = None,
        evict: Evictor | None = None,
    ) -> tuple[Kernel, str]:
        """The kernel this node should run and a note saying how it was chosen.

        ``make_inputs()`` gives the node's inputs to measure on (real for weights, any values
        of the right shape and dtype otherwise), called only if nothing is cached;
        ``static[i]`` says whether input i is fixed for the plan (only those may be pre-packed);
        ``default`` is the kernel the node runs unsearched (the first run's); ``evict``, when
        given, is called before each timed call (``weights_evictor``: the node's weights leave
        the cache between runs).
        """
        candidates = [
            k for k in kernels.candidates(op, attrs, shapes, default, self.use_jit) if _packable(k, static)
        ]
        if not candidates and default is not None:
            return default, ""
        if len(candidates) == 1:
            return candidates[0], ""
        key, among = _key(node, shapes), _among(candidates)
        cached = self.choices.get(key)
        for kernel in candidates:
            if kernel_name(kernel) == cached and self.choices.get(key + AMONG) == among:
                return kernel, "searched, cached"
        best, note = self._measure(candidates, attrs, make_inputs(), node, evict)
        self.choices[key], self.choices[key + AMONG] = kernel_name(best), among
        self._dirty = True
        return best, note

    def cached(
        self,
        op: str,
        node: str,
        attrs: dict[str, Any],
        shapes: list[tuple[int, ...] | None],
        default: Kernel | None = None,
    ) -> Kernel | None:
        """The kernel an earlier load chose for this node and shapes, if it reads no pre-packed
        weights: the first run of a signature comes before any packing, and running the
        device's measured choice there gives a loaded model its first result sooner."""
        name = self.choices.get(_key(node, shapes))
        if name is None or not self.handles(op):
            return None
        for kernel in kernels.candidates(op, attrs, shapes, default, self.use_jit):
            if kernel_name(kernel) == name:
                return None if hasattr(kernel, "pack") else kernel
        return None

    def _measure(
        self,
        candidates: list[Kernel],
        attrs: dict[str, Any],
        inputs: list[np.ndarray | None],
        node: str,
        evict: Evictor | None = None,
    ) -> tuple[Kernel, str]:
        orders: dict[Kernel, tuple[int, ...] | None] = {}
        out_bytes: list[int] = []
        runnable = _agreeing(candidates, attrs, inputs, orders, out_bytes)
        # With the JIT tier a channels-last result is read for free by the next conv (its JIT
        # kernels and numpy's 1x1 read channels last), where an NCHW one costs that conv a
        # transposing copy: a channels-last kernel is kept when it is within a close call or
        # that copy's time of the fastest.  Else a chain starting from an NCHW input
        # (MobileNetV2's stem, a near tie) stays NCHW for layers.
        prefer = {k for k, order in orders.items() if order == CHANNELS_LAST} if self.use_jit else set()
        allowance = sum(out_bytes) * transpose_seconds_per_byte() if prefer else 0.0
        best, note = self._fastest(candidates, attrs, inputs, runnable, prefer, allowance, evict)
        self.output_orders[node] = orders.get(best)
        return best, note

    def _fastest(
        self,
        candidates: list[Kernel],
        attrs: dict[str, Any],
        inputs: list[np.ndarray | None],
        runnable: list[tuple[Kernel, list[np.ndarray | None]]],
        prefer: set[Kernel],
        allowance: float,
        evict: Evictor | None = None,
    ) -> tuple[Kernel, str]:
        best = {kernel: float("inf") for kernel, _ in runnable}
        clock = kernel_clock(self.threads)
        _time_rounds(runnable, attrs, best, clock, evict)
        close = sorted(runnable, key=lambda item: best[item[0]])[:2]
        if len(close) == 2 and best[close[1][0]] <= CLOSE_CALL * best[close[0][0]]:
            _time_rounds(close, attrs, best, clock, evict)  # a close call: more rounds for the two
        timings = [(best[k], k, _extra_bytes(args, inputs)) for k, args in runnable]
        timings.sort(key=lambda item: item[0])
        default = best.get(candidates[0], float("inf"))
        summary = ", ".join(f"{kernel_name(k).rsplit('.', 1)[-1]} {t * 1e3:.2f} ms" for t, k, _ in timings)
        if prefer and timings:
            close_to = max(CLOSE_CALL * timings[0][0], timings[0][0] + allowance)
            timings.sort(key=lambda item: (item[0] > close_to or item[1] not in prefer, item[0]))
        # A kernel holding a pre-packed copy of the weights (Winograd's is 16/9 to 4x their size)
        # must beat the default clearly to be worth that memory (and the timing noise); a small
        # pack needs a smaller margin.
        for seconds, kernel, extra in timings:
            margin = PACKED_MARGIN if extra > SMALL_PACK_BYTES else SMALL_PACK_MARGIN
            if extra <= 0 or seconds <= margin * default:
                return kernel, f"searched: {summary}"
        return candidates[0], f"searched: {summary}"

    def save(self) -> None:
        """Write new choices (atomically; a failure to write only costs a later re-measure)."""
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self._load(), **self.choices}
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as out:
                json.dump(merged, out, sort_keys=True, indent=0)
            os.replace(out.name, self.path)
            self._dirty = False
        except OSError:
            pass


def kernel_clock(threads: int) -> Callable[[], float]:
    """What a candidate's time is read from.  At one thread every kernel runs on the calling
    thread (BLAS capped at one, JIT kernels serial), so its CPU time is its cost, and time the
    scheduler gave other processes does not count: on a busy machine (a device running other
    work, a CI box) wall time picked numpy's depthwise conv at 654 us over the JIT one at 100 us
    on MobileNetV2.  With more threads the work is spread over the pool: wall time it is."""
    return time.thread_time if threads == 1 else time.perf_counter


def _time_rounds(
    runnable: list[tuple[Kernel, list[np.ndarray | None]]],
    attrs: dict[str, Any],
    best: dict[Kernel, float],
    clock: Callable[[], float] = time.perf_counter,
    evict: Evictor | None = None,
) -> None:
    """Each kernel's best time over RUNS rounds, taken in turn so a burst of machine noise
    hits every candidate alike; ``evict(args)`` (untimed) before each call when given."""
    for _ in range(RUNS):
        for kernel, args in runnable:
            if evict is not None:
                evict(args)
            start = clock()
            kernel(args, attrs)
            best[kernel] = min(best[kernel], clock() - start)


# a node's fixed inputs from which its weights count as streamed (a decode step's smallest
# projection is 1 MB; a conv's few KB of taps stay cached between runs whatever the model)
MIN_STREAMED_BYTES = 256 << 10
LINE = 64  # bytes of a cache line: ``weights_evictor`` reads one byte of each
# a second read of the model's fixed values under this share of a flushed read's time: they
# stayed cached (a read from L2 or L3 against one from memory is 3-10x faster)
RESIDENT_SHARE = 0.6


@functools.cache
def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (Linux sysfs; 32 MB where it cannot be read)."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (entry / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KMB")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 << 20)


def weights_stay_cached(static: Mapping[str, Any], flush: Callable[[np.ndarray], None]) -> bool:
    """Whether a model's fixed values, read through once, are still cached when read again:
    measured, the second read's time against a read after ``flush`` put them out of cache.
    The last-level cache's size alone does not tell: a virtual machine's L3 is shared with
    other tenants (a Xeon's 480 MB, where ResNet18's 512-channel convs ran as slowly in a run as
    with their weights flushed).  Reads a byte of each cache line of each value."""
    flats = [
        value.reshape(-1).view(np.uint8)
        for value in static.values()
        if isinstance(value, np.ndarray)
        and value.dtype.kind != "O"
        and value.flags.c_contiguous
        and value.nbytes >= LINE
    ]

    def read() -> float:
        start = time.perf_counter()
        for flat in flats:
            np.bitwise_or.reduce(flat[::LINE])
        return time.perf_counter() - start

    read()
    warm = min(read(), read())
    for flat in flats:
        flush(flat)
    return warm < RESIDENT_SHARE * read()


def weights_evictor(
    static: dict[str, np.ndarray],
    own: Sequence[str],
    one_row: bool = False,
    flush: Callable[[np.ndarray], None] | None = None,
    positions: Sequence[int] = (),
    cached: Callable[[], bool] | None = None,
) -> Evictor | None:
    """For a node whose fixed inputs ``own`` (names in ``static``, the plan's fixed values) are
    at least MIN_STREAMED_BYTES: a call ``evict(args)`` that puts them out of cache, as a run
    does between two calls of the node, so the search times its kernels where the run will find
    its weights.  Where the plan's other fixed values exceed the last-level cache, it reads them
    (up to twice its size).  Else, with ``flush`` (flush_jit's clflush of an array's bytes), it
    flushes the candidate's args at ``positions`` (the fixed inputs, packed as that candidate
    packs them) for a ``one_row`` product (a memory-bound GEMV: a classifier; a run's
    activations and the rest of the machine pass through the cache too), and for any node when
    ``cached()`` (``weights_stay_cached``, asked once it matters) says the model's weights do
    not stay cached between runs.  None where the node's weights are small, or nothing applies
    (timed warm)."""
    mine = [static[name] for name in dict.fromkeys(own) if name in static]
    if sum(value.nbytes for value in mine) < MIN_STREAMED_BYTES:
        return None
    others, total, cache = [], 0, last_level_cache_bytes()
    for name, value in static.items():
        if name in own or not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
            continue
        others.append(value.reshape(-1).view(np.uint8))
        total += value.nbytes
        if total >= 2 * cache:
            break
    if total >= cache:

        def evict(args: list[np.ndarray | None]) -> None:  # noqa: ARG001 - the others, whatever the args
            for flat in others:
                np.bitwise_or.reduce(flat[::LINE])

        return evict
    if flush is None or not (one_row or (cached is not None and not cached())):
        return None

    def flush_own(args: list[np.ndarray | None]) -> None:
        for position in positions:
            value = args[position] if position < len(args) else None
            if isinstance(value, np.ndarray) and value.flags.c_contiguous:
                flush(value.reshape(-1).view(np.uint8))

    return flush_own


def _key(node: str, shapes: Sequence[tuple[int, ...] | None]) -> str:
    return f"{node}|{[None if shape is None else tuple(shape) for shape in shapes]}"


AMONG = "|among"  # the cache entry beside a choice: the candidates it was chosen among


def _among(candidates: Sequence[Kernel]) -> str:
    names = ",".join(sorted(kernel_name(kernel) for kernel in candidates))
    return hashlib.sha256(names.encode()).hexdigest()[:16]


def _agreeing(
    candidates: list[Kernel],
    attrs: dict[str, Any],
    inputs: list[np.ndarray | None],
    orders: dict[Kernel, tuple[int, ...] | None],
    out_bytes: list[int],
) -> list[tuple[Kernel, list[np.ndarray | None]]]:
    """The candidates that run and agree with the first that does, each with its (packed) inputs;
    ``orders`` gets each one's output memory order, ``out_bytes`` the output's size."""
    reference, runnable = None, []
    for kernel in candidates:
        args = with_packed(kernel, inputs, attrs)
        try:
            result = kernel(args, attrs)[0]
        except Exception:  # noqa: BLE001 - a candidate that cannot run is simply not chosen
            continue
        if reference is None:
            reference = result
            out_bytes.append(result.nbytes)
        elif result.shape != reference.shape or not np.allclose(
            result, reference, rtol=1e-3, atol=1e-4 * max(1.0, float(np.max(np.abs(reference), initial=0)))
        ):
            continue
        runnable.append((kernel, args))
        orders[kernel] = memory_order(result)
    return runnable


_transpose_rate: list[float] = []


def transpose_seconds_per_byte() -> float:
    """What an NCHW -> channels-last copy costs here per byte (measured once per process on a
    cache-sized image): the price a channels-last consumer pays for an NCHW input."""
    if not _transpose_rate:
        image = np.ones((1, 32, 48, 48), np.float32)
        target = np.empty((1, 48, 48, 32), np.float32)
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            np.copyto(target, image.transpose(0, 2, 3, 1))
            seconds.append(time.perf_counter() - start)
        _transpose_rate.append(min(seconds) / image.nbytes)
    return _transpose_rate[0]


def _extra_bytes(args: list[np.ndarray | None], inputs: list[np.ndarray | None]) -> int:
    """How much more memory the kernel's packed inputs take than the originals (0: nothing packed)."""
    return sum(
        packed.nbytes - original.nbytes
        for packed, original in zip(args, inputs, strict=True)
        if packed is not original and packed is not None and original is not None
    )


def _packable(kernel: Kernel, static: list[bool]) -> bool:
    """A kernel reading pre-packed weights is only a candidate when those weights are fixed."""
    return not hasattr(kernel, "pack") or (len(static) > 1 and static[1])


def with_packed(
    kernel: Kernel, inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> list[np.ndarray | None]:
    """The node's inputs with the ones the kernel pre-packs replaced by their packed form."""
    pack = getattr(kernel, "pack", None)
    if pack is None:
        return list(inputs)
    args = list(inputs)
    for position, packed in pack(inputs, attrs).items():
        args[position] = packed
    return args
