"""The optional JIT tier: Ferry's own kernels in Python, compiled by numba (``ferry[jit]``).

numpy stays the baseline that runs everywhere; where numba is installed (and ``FERRY_JIT`` is not
``0``) the kernel layer (engine/kernels.py) adds JIT candidates beside the numpy ones and the
kernel search (engine/search.py) measures both per device and node.  Nothing here imports numba
until a JIT kernel is needed: importing it costs ~0.3 s and ~65 MB of resident LLVM.

Compiling is kept out of the hot path.  Every JIT kernel is compiled for explicit signatures when
its module is imported (a ``parallel=True`` variant when a session that may use more than one
thread loads its module, see ``njit``), with numba's on-disk cache in a directory the engine is told
(``set_cache_dir``; the agent passes its state directory) or ``FERRY_JIT_CACHE`` (default
``~/.cache/ferry/jit``), one subdirectory per engine version (``compiled_dir``); ``load()``
imports them (a Session, those its model can use), so a package activation pays the compile, or
the cache load, before the first inference.

Parallel kernels (``prange``) run only when the caller allows more than one thread
(``thread_limit``, set by the session from its ``threads``) and no other thread is inside a
parallel kernel: they run on numba's own thread pool (workqueue, unless NUMBA_THREADING_LAYER
says otherwise), which aborts the process on concurrent launches, so a busy pool means the
serial variant.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

# The modules holding JIT kernels, each beside its numpy twin, with the ops they have candidates
# for (each module's CANDIDATES maps op -> provider).  A session loads only the modules its
# model's nodes can use: a model with none never imports numba (~65 MB of LLVM, ~0.3 s).
MODULES: dict[str, tuple[str, ...]] = {
    "engine.ops.conv.depthwise_jit": ("Conv", "FusedConv"),
    "engine.ops.conv.depthwise_vec_jit": ("Conv", "FusedConv"),
    "engine.ops.conv.direct_jit": ("Conv", "FusedConv"),
    "engine.ops.conv.pointwise_jit": ("Conv", "FusedConv"),
    "engine.ops.conv.im2col_jit": ("Conv", "FusedConv"),
    # a CNN's classifier (Gemm); rides along with the convs (a model of Gemms alone stays numpy)
    "engine.ops.gemv_jit": ("Conv", "FusedConv"),
    # a CNN's stem pool; rides along with the convs too (jit_needs.RIDER_OPS)
    "engine.ops.pool_jit": ("MaxPool",),
    # the conv GEMM; rides along where a UNet's norms bring numba in (its convs are ungrouped)
    "engine.ops.conv.gemm_conv_jit": ("Conv", "FusedConv", "GroupNormalization", "FusedGroupNorm"),
    "engine.ops.conv.winograd_jit": ("Conv", "FusedConv", "GroupNormalization", "FusedGroupNorm"),
    "engine.ops.rows_jit": ("FusedMatMul", "Gelu", "FusedGeglu", "LayerNormalization"),
    # projections with fixed weights on the conv GEMM; rides along with a UNet's norms too
    "engine.ops.matmul_jit": ("FusedMatMul", "MatMul", "GroupNormalization", "FusedGroupNorm"),
    "engine.ops.quantized_jit": ("QMatMul",),
    # QuantizeLinear -> DequantizeLinear -> QMatMul in integers (the planner's QdqMatMul)
    "engine.ops.int8_gemm_jit": ("QdqMatMul", "QdqConv", "QuantizeLinear", "DynamicQuantizeLinear"),
    "engine.ops.int8_conv_jit": ("QdqConv", "QuantizeLinear"),
    "engine.ops.attention_jit": ("FusedAttention",),
    "engine.llm.gemv_jit": ("LlmGemvInt4", "LlmGemvInt8"),
    "engine.llm.attention_jit": ("LlmDecodeAttention",),
    # decode's fused layers (model.py), loaded with the GEMVs so no decode step pays for them
    "engine.llm.layer_jit": ("LlmDecodeLayer", "LlmGemvInt4", "LlmGemvInt8"),
    # prefill's int4 GEMM in integers (gemv_jit's prefill path calls it)
    "engine.llm.prefill_jit": ("LlmGemvInt4",),
    # int4 GEMV and GEMM on the dot layout (gemv_jit and layer_jit call them)
    "engine.llm.dot_jit": ("LlmGemvInt4", "LlmDecodeLayer"),
    # decode's layers in one parallel region per token (model.py, several threads only)
    "engine.llm.spread_jit": ("LlmDecodeSpread",),
    "engine.ops.group_norm_jit": ("GroupNormalization", "FusedGroupNorm"),
    # a UNet's long, narrow-headed attention; rides along once a norm has brought numba in
    "engine.diffusion.attention_jit": ("FusedAttention",),
}

_lock = threading.RLock()
_parallel = threading.Lock()
_local = threading.local()
_cache_dir: Path | None = None
_loaded: dict[str, ModuleType] = {}
# parallel variants not compiled yet, per module: id(dispatcher) -> (dispatcher, signatures)
_deferred: dict[str, dict[int, tuple[Any, list[Any]]]] = {}


def enabled() -> bool:
    """Whether JIT kernels may be used: numba is installed and ``FERRY_JIT`` is not ``0``."""
    return os.environ.get("FERRY_JIT", "1") != "0" and _numba_installed()


@functools.cache  # installed packages do not change under a running process
def _numba_installed() -> bool:
    # find_spec walks sys.path (a stat per entry) while numba is not imported: an AOT LLM process
    # asks per GEMM, 1,800 walks a 256-token prefill
    return importlib.util.find_spec("numba") is not None


def has_vnni() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI (its host, unless NUMBA_CPU_NAME or
    NUMBA_CPU_FEATURES say otherwise): the integer dot-product kernels' instruction."""
    import llvmlite.binding as llvm  # noqa: PLC0415 - only with the JIT tier
    from numba.core import config  # noqa: PLC0415

    if config.CPU_FEATURES is not None:
        return "+avx512vnni" in config.CPU_FEATURES
    if config.CPU_NAME not in (None, "host"):
        return False
    return bool(llvm.get_host_cpu_features().get("avx512vnni", False))


def fingerprint() -> str:
    """What changes JIT timings and results: the numba version, or that there is no JIT tier
    (the kernel search keys its cache on this, so installing or upgrading numba re-measures)."""
    if not enabled():
        return "numpy-only"
    try:
        return f"numba-{importlib.metadata.version('numba')}"
    except importlib.metadata.PackageNotFoundError:
        return "numba-unknown"


def cache_dir() -> Path:
    """Where compiled kernels are cached: ``set_cache_dir``'s, else ``FERRY_JIT_CACHE``, else
    ``~/.cache/ferry/jit``."""
    if _cache_dir is not None:
        return _cache_dir
    configured = os.environ.get("FERRY_JIT_CACHE")
    if configured:
        return Path(configured)
    try:
        return Path.home() / ".cache" / "ferry" / "jit"
    except (RuntimeError, KeyError):  # no home directory (some service accounts)
        return Path(tempfile.gettempdir()) / "ferry-jit"


KEPT_ENGINES = 3  # compiled-kernel directories kept beside the current one's (see compiled_dir)


def compiled_dir() -> Path:
    """numba's cache for this engine: ``cache_dir()/engine-<digest of the engine's sources>``.

    numba keys a cached kernel on its own file alone, but kernels inline code from other files
    (layer_jit's decode layers carry dot_jit's GEMVs, int_dot_ir's IR serves three modules): an
    engine upgrade that changed only the inlined file kept the old compiled code, slow or wrong
    for a changed layout (seen: a decode step at 43 ms on dot_jit's replaced int8 path, 20 ms
    compiled afresh).  Any change to the engine compiles every kernel again, once."""
    return cache_dir() / f"engine-{engine_digest()}"


@functools.cache  # the engine's files do not change under a running process
def engine_digest() -> str:
    """A digest of the engine's sources: the kernel search re-measures when it changes (a
    kernel rewritten under the same name is a different speed), and compiled kernels are kept
    per value (``compiled_dir``)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _remove_stale(current: Path) -> None:
    """Delete all but the KEPT_ENGINES newest other engines' compiled kernels (an older agent
    still running keeps what it has loaded; a later start of it compiles again)."""
    others = [p for p in current.parent.glob("engine-*") if p.is_dir() and p != current]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in others[KEPT_ENGINES:]:
        shutil.rmtree(stale, ignore_errors=True)


def set_cache_dir(path: str | os.PathLike[str]) -> None:
    """Cache compiled kernels under ``path`` (e.g. the agent's state directory).  Takes effect
    for kernels not yet loaded in this process: call it before ``load()``."""
    global _cache_dir
    with _lock:
        _cache_dir = Path(path)
        if "numba" in sys.modules:
            _configure_numba()


def load(
    path: str | os.PathLike[str] | None = None,
    ops: Iterable[str] | None = None,
    threads: int = 1,
    skip: Iterable[str] = (),
) -> float:
    """Compile (or load from the cache) the JIT kernels for ``ops`` (default: all) now, their
    parallel variants too when ``threads`` > 1, but not the modules in ``skip`` (none of the
    model's nodes can use them); returns the seconds it took (0 when the JIT tier is off).  A
    Session calls it when it is created (package activation), so no inference pays for it."""
    if path is not None:
        set_cache_dir(path)
    if not enabled():
        return 0.0
    wanted = None if ops is None else set(ops)
    start = time.perf_counter()
    for name, handled in MODULES.items():
        if name not in skip and (wanted is None or wanted.intersection(handled)):
            module(name)
            if threads > 1:
                _compile_deferred(name)
    return time.perf_counter() - start


def module(name: str) -> ModuleType:
    """One JIT kernel module, imported (its kernels compiled) with the cache configured first."""
    with _lock:
        found = _loaded.get(name)
        if found is None:
            _configure_numba()
            found = _loaded[name] = importlib.import_module(name)
        return found


def loaded() -> list[ModuleType]:
    """The JIT kernel modules loaded so far (by ``load`` or ``module``); none when the tier is off."""
    if not enabled():
        return []
    with _lock:
        return [_loaded[name] for name in MODULES if name in _loaded]


def njit(signatures: list[Any] | Any, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """numba.njit with Ferry's defaults: compiled for ``signatures`` only (a call with other types
    raises TypeError instead of compiling in a run), cached on disk, GIL released.

    Compiled when its module is imported, except ``parallel=True`` variants: those only run for
    sessions allowed more than one thread (``run``), and numba's parfor lowering makes each cost
    2-4x its serial twin (MobileNetV2's four: 11 of its 25 s of first-compile CPU), so ``load``
    compiles them for such sessions only (``run`` would compile one a caller reached without)."""
    import numba  # noqa: PLC0415 - only JIT kernel modules call this

    if not options.get("parallel"):
        return numba.njit(signatures, cache=True, nogil=True, **options)
    wanted = list(signatures) if isinstance(signatures, list) else [signatures]

    def deferred(function: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(cache=True, nogil=True, **options)(function)
        with _lock:
            _deferred.setdefault(function.__module__, {})[id(dispatcher)] = (dispatcher, wanted)
        return dispatcher

    return deferred


def _compile_deferred(name: str, only: Any = None) -> None:
    """Compile module ``name``'s parallel variants (or just ``only``) for their signatures, as
    numba.njit(signatures) would have: then no other signature compiles."""
    with _lock:
        pending = _deferred.get(name, {})
        for key in [id(only)] if only is not None else list(pending):
            found = pending.pop(key, None)
            if found is not None:
                dispatcher, signatures = found
                for signature in signatures:
                    dispatcher.compile(signature)
                dispatcher.disable_compile()


def array(dtype: Any, ndim: int, layout: str = "A", readonly: bool = False) -> Any:
    """A numba array type for signatures; ``readonly`` ones accept writeable arrays too (inputs
    may be read-only: weights mapped from the package, plan constants)."""
    from numba import types  # noqa: PLC0415 - only JIT kernel modules call this

    return types.Array(dtype, ndim, layout, readonly=readonly)


@contextlib.contextmanager
def thread_limit(threads: int) -> Iterator[None]:
    """Let JIT kernels called on this thread use up to ``threads`` threads."""
    previous = getattr(_local, "threads", 1)
    _local.threads = max(1, int(threads))
    try:
        yield
    finally:
        _local.threads = previous


@contextlib.contextmanager
def pool_closed() -> Iterator[None]:
    """``run`` calls the serial kernel on this thread for the block: engine/team.py's spinning
    worker has the second core, and numba's pool threads would contend for it."""
    previous = getattr(_local, "pool_closed", False)
    _local.pool_closed = True
    try:
        yield
    finally:
        _local.pool_closed = previous


def threads() -> int:
    """The thread count JIT kernels may use on this thread (1 unless ``thread_limit`` says)."""
    return getattr(_local, "threads", 1)


def run(serial: Callable[..., Any], parallel: Callable[..., Any], *args: Any) -> Any:
    """``parallel(*args)`` on up to ``threads()`` threads when allowed and the pool is free,
    else ``serial(*args)``."""
    wanted = threads()
    if wanted > 1 and not getattr(_local, "pool_closed", False) and _parallel.acquire(blocking=False):
        try:
            import numba  # noqa: PLC0415 - loaded already: a JIT kernel is calling

            if id(parallel) in _deferred.get(parallel.py_func.__module__, ()):
                _compile_deferred(parallel.py_func.__module__, parallel)  # a caller outside load
            numba.set_num_threads(min(wanted, numba.config.NUMBA_NUM_THREADS))
            return parallel(*args)
        finally:
            _parallel.release()
    return serial(*args)


def _configure_numba() -> None:
    """Point numba's cache at ``compiled_dir()`` (read when a cached function is defined)."""
    import numba  # noqa: PLC0415

    directory = compiled_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale(directory)
    numba.config.CACHE_DIR = str(directory)
    if not os.environ.get("NUMBA_THREADING_LAYER"):
        # numba's own pool, not OpenMP's: libgomp's threads spin after each parallel kernel and
        # starve the OpenBLAS threads of the GEMM that follows on a 2-core machine (MobileNetV2
        # at 2 threads: 134 ms with OpenMP, 16 with this pool, 24 numpy-only)
        numba.config.THREADING_LAYER = "workqueue"
