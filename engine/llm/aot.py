"""The LLM's decode and prefill kernels compiled ahead of time (numba.pycc) into one extension
module, so a serving process runs them without importing numba or LLVM (the default;
``FERRY_LLM_AOT=0`` keeps numba's JIT).

Why: numba and LLVM resident in the serving process were the largest share of its peak RSS
(SmolLM2-135M shapes: ``import numba`` ~55 MB, the first JIT module's LLVM setup ~68, the other
modules ~27, beside 74 MB of mapped weights).  The extension holds the same kernels' machine
code (the same Python sources, compiled by the same numba for the same CPU), so it gives the
same bits; it is built once per (kernel sources, numba, numpy, Python, CPU) in a subprocess,
whose LLVM exits with it, and cached beside the JIT cache (``jit.cache_dir()/llm-aot``).

What it covers: layer_jit's kernels (every signature), dot_jit's int4/int8 GEMV and prefill
GEMM on the dot layouts, spread_jit's token workers and prefill's causal softmax
(attention_jit), i.e. the converter's packages.  pycc has
no ``parallel=True``, but its wrappers are built to release the GIL as numba's JIT kernels do,
so several threads still run them: prefill's row parts and decode's token workers
(batch_split's pool, spread.py).
Anything else (row-grouped int4 prefill, float int8, LoRA's per-op path) still goes through
``jit.module``: numba is then imported as before.  No extension for this key: the numba path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from engine import jit
from engine.llm import gemv

# kernel module -> the functions exported from it (each signature as ``<name>_<i>``)
EXPORTS: dict[str, tuple[str, ...]] = {
    "engine.llm.layer_jit": (
        "layer",
        "layer_int8_cache",
        "add_norm",
        "attend",
        "attend_int8",
        "swiglu",
        "swiglu_rows",
    ),
    "engine.llm.dot_jit": ("gemv_dot", "gemv_dot8", "_gemm", "_gemm8", "_activations"),
    "engine.llm.spread_jit": ("token_open", "token_work"),
    "engine.llm.attention_jit": ("causal_softmax",),
}
# the sources whose text the compiled code depends on (the kernels inline across these files)
_SOURCES = (
    "engine/llm/layer_jit.py",
    "engine/llm/dot_jit.py",
    "engine/llm/gemv.py",
    "engine/llm/gemv_jit.py",
    "engine/llm/attention_jit.py",
    "engine/llm/spread_jit.py",
    "engine/ops/atomic_jit.py",
    "engine/ops/int_dot_ir.py",
    "engine/jit.py",
    "engine/llm/aot.py",
)
# the exports of one signature, called by their own names
_SINGLE = ("add_norm", "attend", "attend_int8", "swiglu", "swiglu_rows", "token_open", "causal_softmax")
_ROOT = Path(__file__).resolve().parents[2]
_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def enabled() -> bool:
    """Whether the serving process should use the AOT kernels: on unless ``FERRY_LLM_AOT=0``
    (numba's JIT then, ~150 MB more resident), and only with the JIT tier (numba installed, which
    builds them, and ``FERRY_JIT`` not ``0``: numpy-only runs stay numpy-only).  Used only once
    built: activation (``prepare``) builds."""
    return os.environ.get("FERRY_LLM_AOT", "1") != "0" and jit.enabled()


def _cpu() -> str:
    """The host CPU's identity without LLVM: its feature flags (the extension is built for
    ``host``, so another CPU must not load it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return platform.machine() + ":" + " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.machine() + ":" + platform.processor()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=8)  # sources and CPU do not change under a running process
def key(engine_version: str | None = None) -> str:
    """What the extension's code depends on, hashed: the kernel sources (``engine_version``
    overrides them, for tests), numba, numpy, Python and the CPU."""
    digest = hashlib.sha256()
    if engine_version is None:
        for source in _SOURCES:
            digest.update((_ROOT / source).read_bytes())
    else:
        digest.update(engine_version.encode())
    for part in (_version("numba"), np.__version__, sys.implementation.cache_tag, _cpu()):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:20]


def path(engine_version: str | None = None) -> Path:
    """Where the extension for this key lives (it may not exist)."""
    name = f"ferry_llm_aot_{key(engine_version)}"
    return jit.cache_dir() / "llm-aot" / (name + importlib.machinery.EXTENSION_SUFFIXES[0])


def build(timeout: float = 900.0) -> Path:
    """Compile the extension for this key in a subprocess (LLVM lives and dies there) unless it
    exists; its path.  Package activation calls this (``prepare``), never a request."""
    target = path()
    if not target.exists():
        env = dict(os.environ, FERRY_JIT_CACHE=str(jit.cache_dir()))
        command = [sys.executable, "-m", "engine.llm.aot", str(target)]
        subprocess.run(command, check=True, env=env, timeout=timeout, capture_output=True)
        with _lock:
            _loaded.pop(str(target), None)
    _remove_stale(target)
    return target


def _remove_stale(target: Path) -> None:
    """Delete the extensions (and manifests) of other keys beside ``target``: an engine, numba or
    CPU change leaves its predecessor's ~10 MB behind otherwise.  A process still running an old
    one keeps its mapping (Linux frees the file when the last user unmaps it)."""
    for other in target.parent.glob("ferry_llm_aot_*"):
        if other.name.split(".")[0] != target.name.split(".")[0]:
            other.unlink(missing_ok=True)


def prepare() -> bool:
    """At activation: build the extension when AOT is on, so serving loads it; whether it is
    there (a failed build logs and leaves the numba path)."""
    if not enabled():
        return False
    try:
        build()
    except (subprocess.SubprocessError, OSError) as error:
        import logging  # noqa: PLC0415

        logging.getLogger(__name__).warning("LLM AOT kernels not built (numba path kept): %s", error)
        return False
    return kernels() is not None


def kernels(engine_version: str | None = None) -> AotKernels | None:
    """The AOT kernels for this key, loaded once; None when AOT is off or none is built."""
    if not enabled():
        return None
    target = str(path(engine_version))
    found = _loaded.get(target, False)  # asked per GEMM: no lock once looked for
    if found is False:
        with _lock:
            found = _loaded.get(target, False)
            if found is False:  # looked for once per process (``build`` clears a miss)
                found = _loaded[target] = AotKernels(_import(Path(target))) if Path(target).exists() else None
    return found


def _import(target: Path) -> ModuleType:
    name = target.name.split(".")[0]
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AotKernels:
    """The extension behind the names model.py and weights.py call on layer_jit / dot_jit (and
    gemv_jit's GEMV entry points), each numba signature picked as numba's dispatcher would."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        for name in _SINGLE:
            setattr(self, name, getattr(module, name + "_0"))

    def token_work(self, *args: Any) -> None:
        """spread_jit.token_work: the signature for the scales' dtype (int8's float32 first)."""
        getattr(self.module, f"token_work_{0 if args[1].dtype == np.float32 else 1}")(*args)

    def layer(self, *args: Any) -> None:
        """layer_jit.layer: the signature for the four matrices' kind."""
        getattr(self.module, f"layer_{_kind(args[2], args[3])}")(*args)

    def layer_int8_cache(self, *args: Any) -> None:
        getattr(self.module, f"layer_int8_cache_{_kind(args[2], args[3])}")(*args)

    def gemv_int4(self, inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        """gemv_jit.gemv_int4_jit: the dot layout here, any other through numba."""
        x, packed, scale = inputs
        if int(attrs.get("group", 1)) != 16:
            return jit.module("engine.llm.gemv_jit").gemv_int4_jit(inputs, attrs)
        k = packed.shape[1] * 2
        out = np.empty(packed.shape[0], np.float32)
        w, halves = _flat(packed), np.asarray(scale).view(np.uint16).view(np.ndarray).reshape(-1)
        x = np.ascontiguousarray(x, np.float32)
        self.module.gemv_dot_0(x, w, halves, int(attrs["block"]), *_scratch(k), out)
        return [out]

    def gemv_int8(self, inputs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        """gemv_jit.gemv_int8_jit: the int8 dot layout here, plain int8 through numba."""
        x, q, scale = inputs
        if q.dtype != np.uint8:
            return jit.module("engine.llm.gemv_jit").gemv_int8_jit(inputs, attrs)
        out = np.empty(q.shape[0], np.float32)
        x = np.ascontiguousarray(x, np.float32)
        self.module.gemv_dot8_0(x, _flat(q), np.asarray(scale).view(np.ndarray), *_scratch(x.size), out)
        return [out]

    def gemm(self, x: np.ndarray, packed: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
        """dot_jit.gemm, serial."""
        m, n = x.shape[0], packed.shape[0]
        padded, xq, off, dx = self._rounded(x, block)
        out = np.zeros(padded * n, np.float32)
        s = np.asarray(scale).view(np.uint16).view(np.ndarray).reshape(-1)
        self.module._gemm_0(xq, off, dx, padded, x.shape[1], _flat(packed), s, block, out)
        return out.reshape(padded, n)[:m]

    def gemm8(self, x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """dot_jit.gemm8, serial."""
        m, n = x.shape[0], q.shape[0]
        padded, xq, off, dx = self._rounded(x, gemv.DOT_BLOCK8)
        out = np.zeros(padded * n, np.float32)
        s = np.asarray(scale).view(np.ndarray)
        self.module._gemm8_0(xq, off, dx, padded, x.shape[1], _flat(q), s, out)
        return out.reshape(padded, n)[:m]

    def _rounded(self, x: np.ndarray, block: int) -> tuple:
        """dot_jit._rounded: x padded to whole steps of 8 rows, rounded to int8 per block."""
        m, k = x.shape
        padded = -(-m // gemv.DOT_TOKENS) * gemv.DOT_TOKENS
        flat = np.zeros(padded * k, np.float32)
        flat[: m * k] = np.ascontiguousarray(x, np.float32).reshape(-1)
        xq = np.empty(padded * k, np.int8)
        off = np.empty(padded * (k // gemv.DOT_SUB), np.int32)
        dx = np.empty(padded * (k // gemv.DOT_SUB), np.float32)
        self.module._activations_0(flat, padded, block, xq, off, dx)
        return padded, xq, off, dx


def _kind(w: np.ndarray, s: np.ndarray) -> int:
    """layer_jit._signatures' order: row-grouped int4, int4 dot layout, int8 dot layout, int8."""
    if w.ndim == 3:
        return 0
    if w.ndim == 1:
        return 2 if s.dtype == np.float32 else 1
    return 3


def _flat(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).view(np.ndarray).reshape(-1)


def _scratch(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.empty(k, np.int8),
        np.empty(k // gemv.DOT_SUB, np.int32),
        np.empty(k // gemv.DOT_SUB, np.float32),
    )


def _compile(target: Path) -> None:
    """Compile EXPORTS into ``target`` (run in the subprocess ``build`` starts)."""
    import tempfile  # noqa: PLC0415

    from numba.core.codegen import AOTCPUCodegen  # noqa: PLC0415 - the build subprocess only
    from numba.pycc import CC  # noqa: PLC0415
    from numba.pycc import compiler as pycc_compiler  # noqa: PLC0415

    # pycc gives LLVM the CPU's name with no features (its model's defaults); numba's JIT gives it
    # the host's feature list.  They differ (FMA contraction, vector widths, a VM's masked
    # features), and so did the bits (an int8-cache decode step, ~1e-7): compile as the JIT does.
    AOTCPUCodegen._customize_tm_features = lambda self: self._get_host_cpu_features()
    # pycc's wrappers hold the GIL through the call, where numba's JIT (jit.njit: nogil) drops it;
    # released, the prefill parts and spread.py's decode workers run on several threads here too
    pycc_compiler.Flags = _releasing_gil()
    name = target.name.split(".")[0]
    compiler = CC(name)
    compiler.target_cpu = "host"  # as numba's JIT compiles (the key holds the CPU's flags)
    for module_name, functions in EXPORTS.items():
        module = jit.module(module_name)
        for function in functions:
            dispatcher = getattr(module, function)
            for i, signature in enumerate(dispatcher.nopython_signatures):
                compiler.export(f"{function}_{i}", signature)(_calling(dispatcher, len(signature.args)))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        compiler.output_dir = scratch
        compiler.compile()
        built = Path(scratch) / compiler.output_file
        os.replace(built, target)  # whole or absent: a reader never sees half a file
    manifest = {"numba": _version("numba"), "numpy": np.__version__, "python": sys.implementation.cache_tag}
    target.with_suffix(".json").write_text(json.dumps(manifest))


def _releasing_gil() -> type:
    from numba.core.compiler import Flags  # noqa: PLC0415 - the build subprocess only

    class ReleasingGil(Flags):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    return ReleasingGil


def _calling(dispatcher: Any, arity: int) -> Any:
    """A function of ``arity`` arguments that calls ``dispatcher``: pycc compiles an exported
    function with default options, so exporting ``py_func`` itself would drop the kernel's own
    (fastmath, inline); through its dispatcher the kernel compiles as under the JIT."""
    names = ", ".join(f"a{i}" for i in range(arity))
    namespace: dict[str, Any] = {"kernel": dispatcher}
    exec(f"def call({names}):\n    return kernel({names})\n", namespace)  # noqa: S102 - fixed text
    return namespace["call"]


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
